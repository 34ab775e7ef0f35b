"""agl for the OpenAI Agents SDK: record model calls, tools, agents and handoffs for RL training.

One line::

    from agents import add_trace_processor
    from agl_openai_agents import AglTracingProcessor
    add_trace_processor(AglTracingProcessor())

or ``agl_openai_agents.instrument()``, or ``AGL_OPENAI_AGENTS_INSTRUMENT=1`` in the
environment.
"""

from agl_openai_agents._guard import errors
from agl_openai_agents.instrument import instrument, instrumented, uninstrument
from agl_openai_agents.processor import AglTracingProcessor

__all__ = ["AglTracingProcessor", "errors", "instrument", "instrumented", "uninstrument"]
