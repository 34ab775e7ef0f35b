"""The zero-line integration: add agl's processor to the SDK's trace processors.

Setting ``AGL_OPENAI_AGENTS_INSTRUMENT=1`` calls :func:`instrument` at interpreter
start (a ``.pth`` file installed with the package reads it).
"""

from __future__ import annotations

import threading

from agl_openai_agents import _response_ids
from agl_openai_agents.processor import AglTracingProcessor

_lock = threading.Lock()
_processor: AglTracingProcessor | None = None


def instrument() -> AglTracingProcessor:
    """Add an :class:`AglTracingProcessor` with ``add_trace_processor`` (once) and return it.

    The user's processors, the SDK's default OpenAI exporter included, stay in place.
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
    but idle; the response id hook is removed.
    """
    global _processor
    with _lock:
        if _processor is not None:
            _processor.enabled = False
            _processor = None
        _response_ids.uninstall()


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return _processor is not None
