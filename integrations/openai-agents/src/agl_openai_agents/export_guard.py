"""Keep the SDK's default trace exporter from sending agl's credentials and recordings to OpenAI.

The Agents SDK registers a processor of its own that posts every trace and span to
OpenAI's tracing endpoint (``https://api.openai.com/v1/traces/ingest``), with
``OPENAI_API_KEY`` unless the run names a tracing key of its own. Under agl that variable is
not an OpenAI key: ``agl run`` and the runner set it to the rollout's key (and
``OPENAI_BASE_URL`` to the rollout's route on the gateway), and an agent behind a gateway in
production holds the gateway's token. Left alone, the exporter would hand that credential
and the run's traces to a host the user never named.

So when agl's processor is made, the SDK's default processor is swapped (with the SDK's
``set_trace_processors``; every other processor stays, in its place) for
:class:`GuardedDefaultProcessor`, which passes a trace or span on only when the key it
would be exported with is the user's own OpenAI key:

- the run's own tracing key (``RunConfig(tracing={"api_key": ...})``), unless it is a rollout key;
- else the exporter's key (``set_tracing_export_api_key``, else ``OPENAI_API_KEY``), unless it is
  a rollout key, or it is ``OPENAI_API_KEY`` while ``OPENAI_BASE_URL`` names another host
  than OpenAI's (the key is that host's: the gateway's).

Anything else is not queued at all. A user who wants OpenAI's trace viewer under agl passes
an OpenAI key of their own with ``set_tracing_export_api_key`` or the run's tracing config.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit

from agents.tracing import Trace, TracingProcessor

from agl.credentials import looks_like_rollout_key

log = logging.getLogger("agl_openai_agents")

_OPENAI_HOST = "api.openai.com"


def _base_url_elsewhere() -> bool:
    """Whether ``OPENAI_BASE_URL`` (or ``OPENAI_API_BASE``) names a host other than OpenAI's."""
    url = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
    if not url:
        return False
    return (urlsplit(url).hostname or "") != _OPENAI_HOST


def users_openai_key(item: Any, exporter: Any) -> bool:
    """Whether ``item`` (a trace or span) would be exported with an OpenAI key of the user's own."""
    key = getattr(item, "tracing_api_key", None)
    if key:
        return not looks_like_rollout_key(key)
    key = exporter.api_key
    if not key or looks_like_rollout_key(key):
        return False
    return not (key == os.environ.get("OPENAI_API_KEY") and _base_url_elsewhere())


class GuardedDefaultProcessor(TracingProcessor):
    """The SDK's default processor, handed only what may go to OpenAI (see the module docstring)."""

    def __init__(self, inner: Any, exporter: Any):
        self.inner = inner
        """The SDK's default ``BatchTraceProcessor``."""
        self.exporter = exporter
        """Its exporter (``default_exporter()``), asked which key it would send."""

    def _pass(self, hook: str, item: Any) -> None:
        if users_openai_key(item, self.exporter):
            getattr(self.inner, hook)(item)

    def on_trace_start(self, trace: Trace) -> None:
        self._pass("on_trace_start", trace)

    def on_trace_end(self, trace: Trace) -> None:
        self._pass("on_trace_end", trace)

    def on_span_start(self, span: Any) -> None:
        self._pass("on_span_start", span)

    def on_span_end(self, span: Any) -> None:
        self._pass("on_span_end", span)

    def shutdown(self, timeout: float | None = None) -> None:
        self.inner.shutdown(timeout)

    def force_flush(self) -> None:
        self.inner.force_flush()


def guard_default_exporter() -> None:
    """Swap the SDK's default processor for a :class:`GuardedDefaultProcessor` (once; idempotent).

    The SDK has no public call that lists the processors, so the list is read from the
    default provider (the SDK versions in :data:`agl_openai_agents.instrument.TESTED`); where it
    cannot be read, the processors are set to the guard alone (agl's own is added after it).
    """
    from agents import set_trace_processors
    from agents.tracing import get_trace_provider
    from agents.tracing.processors import default_exporter, default_processor

    default = default_processor()
    provider = get_trace_provider()
    current = getattr(getattr(provider, "_multi_processor", None), "_processors", None)
    if current is None:
        log.warning("agl_openai_agents: cannot list the SDK's trace processors; keeping only the guarded default")
        current = (default,)
    if not any(p is default for p in current):
        return  # guarded already, or the user took the default processor out
    guard = GuardedDefaultProcessor(default, default_exporter())
    set_trace_processors([guard if p is default else p for p in current])
