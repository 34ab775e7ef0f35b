"""agl for AutoGen AgentChat: record model calls, agents, teams and tools for RL training.

One line — wrap the model client::

    from agl_autogen import AglChatCompletionClient
    agent = AssistantAgent("solver", model_client=AglChatCompletionClient(client))

Zero lines — ``agl_autogen.instrument()`` in code, or ``AGL_AUTOGEN_INSTRUMENT=1``
in the environment.
"""

from agl_autogen._guard import errors
from agl_autogen.client import AglChatCompletionClient
from agl_autogen.instrument import instrument, instrumented, uninstrument

__all__ = ["AglChatCompletionClient", "errors", "instrument", "instrumented", "uninstrument"]
