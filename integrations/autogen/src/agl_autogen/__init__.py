"""agl for AutoGen AgentChat: record model calls, agents, teams and tools for RL training.

One line — wrap the model client::

    from agl_autogen import AglChatCompletionClient
    agent = AssistantAgent("solver", model_client=AglChatCompletionClient(client))

Zero lines — ``agl_autogen.instrument()`` in code, or ``AGL_AUTOGEN_INSTRUMENT=1``
in the environment.
"""

from agl.capture import error_guard
from agl_autogen.client import AglChatCompletionClient
from agl_autogen.instrument import ENV_VAR, instrument, instrumented, uninstrument

__version__ = "0.1.0"

errors = error_guard("agl_autogen").errors
"""agl's own failures swallowed so far, by place (see :class:`agl.capture.ErrorGuard`)."""

__all__ = ["ENV_VAR", "AglChatCompletionClient", "errors", "instrument", "instrumented", "uninstrument"]
