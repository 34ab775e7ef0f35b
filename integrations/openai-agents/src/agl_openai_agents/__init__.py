"""agl for the OpenAI Agents SDK: record model calls, tools, agents and handoffs for RL training.

One line::

    from agents import add_trace_processor
    from agl_openai_agents import AglTracingProcessor
    add_trace_processor(AglTracingProcessor())

or ``agl_openai_agents.instrument()``, or ``AGL_OPENAI_AGENTS_INSTRUMENT=1`` in the
environment.
"""

from agl.capture import error_guard
from agl_openai_agents.instrument import ENV_VAR, instrument, instrumented, uninstrument
from agl_openai_agents.processor import AglTracingProcessor

__version__ = "0.1.0"

errors = error_guard("agl_openai_agents").errors
"""agl's own failures swallowed so far, by place (see :class:`agl.capture.ErrorGuard`)."""

__all__ = ["ENV_VAR", "AglTracingProcessor", "errors", "instrument", "instrumented", "uninstrument"]
