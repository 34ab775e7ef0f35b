"""Fake chat models for the LangChain tests (langchain-core's own fakes, extended)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.utils.function_calling import convert_to_openai_tool


class ToolCallingFakeModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` with ``bind_tools`` (the generic fake raises NotImplementedError).

    Binding converts the tools to OpenAI form and passes them as call kwargs, as
    ChatOpenAI does, so callbacks see them in ``invocation_params["tools"]``.
    """

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any):
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def fake_model(replies: Iterable[str | AIMessage], *, cycle: int = 1) -> ToolCallingFakeModel:
    """A fake model answering ``replies`` in order (``cycle`` times over)."""
    messages = [r if isinstance(r, AIMessage) else AIMessage(r) for r in replies] * cycle
    return ToolCallingFakeModel(messages=iter(messages))


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """An assistant message that calls one tool."""
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])
