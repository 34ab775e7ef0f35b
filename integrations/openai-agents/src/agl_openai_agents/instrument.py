"""The zero-line integration: add agl's processor to the SDK's trace processors.

Setting ``AGL_OPENAI_AGENTS_INSTRUMENT=1`` calls :func:`instrument` at interpreter
start: the ``agl_openai_agents.pth`` file installed with the package imports
:mod:`agl_openai_agents._autoload`, which runs :func:`autoload`.
"""

from __future__ import annotations

import threading

from agl.capture import error_guard
from agl.capture.versions import check_version
from agl.env import OPENAI_AGENTS_INSTRUMENT
from agl_openai_agents import _requests, _response_ids
from agl_openai_agents.processor import AglTracingProcessor

ENV_VAR = OPENAI_AGENTS_INSTRUMENT
"""Switch on (``1``, ``true``, ``yes``, ``on``; see :func:`agl.capture.env_flag`) to instrument at start."""

TESTED = "openai-agents>=0.24,<0.25"
"""The Agents SDK versions agl-openai-agents is tested with; the package installs up to ``<1``."""

_guard = error_guard("agl_openai_agents")


def check_framework_version() -> bool:
    """Whether the installed SDK is in :data:`TESTED`; outside it warns once (raises with ``AGL_STRICT_VERSIONS=1``).

    Called by :class:`AglTracingProcessor` (and so by :func:`instrument`) before any hook goes in.
    """
    return check_version(
        "agl_openai_agents",
        TESTED,
        still_works="the trace processor on the SDK's public tracing API (model calls from generation and "
        "response spans, tools, agents, handoffs, guardrails)",
        may_break="the two hooks on private SDK methods, OpenAIChatCompletionsModel._fetch_response (the "
        "response id of Chat Completions calls) and OpenAIResponsesModel._fetch_response (the request of a "
        "failed Responses API call), which join those calls to the gateway's token ids",
    )


_lock = threading.Lock()
_processor: AglTracingProcessor | None = None


def instrument() -> AglTracingProcessor:
    """Add an :class:`AglTracingProcessor` with ``add_trace_processor`` (once) and return it.

    The user's processors stay in place; the SDK's default OpenAI exporter stays too, but is
    handed only what would go out with the user's own OpenAI key
    (:mod:`agl_openai_agents.export_guard`): never a rollout key, a gateway token or their traces.
    """
    global _processor
    with _lock:
        if _processor is None:
            from agents import add_trace_processor

            _processor = AglTracingProcessor()
            add_trace_processor(_processor)
        return _processor


def uninstrument() -> None:
    """Stop capturing: agl's processor ignores everything from now on.

    The SDK has no call to remove one processor, so the processor stays registered
    but idle; the response id and request hooks are removed.
    """
    global _processor
    with _lock:
        if _processor is not None:
            _processor.enabled = False
            _processor = None
        _response_ids.uninstall()
        _requests.uninstall()


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return _processor is not None


def autoload() -> bool:
    """The zero-line hook ``agl_openai_agents.pth`` runs at start: :func:`instrument` if ``ENV_VAR`` is on.

    Returns whether it instrumented. A value :func:`agl.capture.env_flag` refuses is
    reported (a warning on the ``agl_openai_agents`` logger) and leaves capture off.
    """
    return _guard.instrument_if_on(ENV_VAR, instrument)
