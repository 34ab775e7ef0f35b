"""agl for LangChain and LangGraph: train existing agents with one line of code, or none.

::

    from agl_langchain import AglCallbackHandler
    graph.invoke(inputs, config={"callbacks": [AglCallbackHandler()]})

    import agl_langchain
    agl_langchain.instrument()          # every run in the process, no callbacks passed

or set ``AGL_LANGCHAIN_INSTRUMENT=1`` in the environment and change nothing.

Rewards from inside the agent: ``agl.emit_reward(1.0)`` or
``dispatch_custom_event("agl_reward", {"value": 1.0})``; rewards after the fact:
:func:`reward_run`.
"""

from agl_langchain.feedback import reward_run, span_id_of
from agl_langchain.handler import AGENT_METADATA_KEY, REWARD_EVENT, AglCallbackHandler
from agl_langchain.instrument import ENV_VAR, active_handler, instrument, instrumented, uninstrument

__version__ = "0.1.0"

__all__ = [
    "AGENT_METADATA_KEY",
    "ENV_VAR",
    "REWARD_EVENT",
    "AglCallbackHandler",
    "active_handler",
    "instrument",
    "instrumented",
    "reward_run",
    "span_id_of",
    "uninstrument",
]
