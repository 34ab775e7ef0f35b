"""The zero-line integration: add agl's processor to the SDK's trace processors.

Setting ``AGL_OPENAI_AGENTS_INSTRUMENT=1`` calls :func:`instrument` at interpreter
start: the ``agl_openai_agents.pth`` file installed with the package runs
:func:`agl.capture.integration.autoload`, which runs :func:`autoload`. The contract
these functions share with the other integrations is :mod:`agl.capture.integration`'s.
"""

from __future__ import annotations

import threading

from agl.capture import error_guard
from agl.env import OPENAI_AGENTS_INSTRUMENT
from agl_openai_agents import _requests, _response_ids
from agl_openai_agents.processor import AglTracingProcessor
from agl_openai_agents.supported import TESTED, check_framework_version

__all__ = ["ENV_VAR", "TESTED", "autoload", "check_framework_version", "instrument", "instrumented", "uninstrument"]

ENV_VAR = OPENAI_AGENTS_INSTRUMENT
"""Switch on (``1``, ``true``, ``yes``, ``on``; see :func:`agl.capture.env_flag`) to instrument at start."""

_guard = error_guard("agl_openai_agents")


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
