"""AutoGen model types → OpenTelemetry GenAI message shapes (``role`` + ``parts``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autogen_core import FunctionCall
from autogen_core.models import (
    AssistantMessage,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    SystemMessage,
    UserMessage,
)


def _text(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        return {"type": "text", "content": content}
    return {"type": type(content).__name__.lower()}  # an Image or other non-text part: its kind only


def _call(call: FunctionCall) -> dict[str, Any]:
    return {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for item in content:
        parts.append(_call(item) if isinstance(item, FunctionCall) else _text(item))
    return parts


def input_messages(messages: Sequence[LLMMessage]) -> list[dict[str, Any]]:
    """The messages of one ``create`` call as ``gen_ai.input.messages``."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "parts": [{"type": "text", "content": m.content}]})
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "name": m.source, "parts": _content_parts(m.content)})
        elif isinstance(m, AssistantMessage):
            parts = _content_parts(m.content)
            if m.thought:
                parts.insert(0, {"type": "reasoning", "content": m.thought})
            out.append({"role": "assistant", "name": m.source, "parts": parts})
        elif isinstance(m, FunctionExecutionResultMessage):
            out.append(
                {
                    "role": "tool",
                    "parts": [
                        {"type": "tool_call_response", "id": r.call_id, "name": r.name, "response": r.content}
                        for r in m.content
                    ],
                }
            )
        else:
            out.append({"role": "unknown", "parts": [{"type": type(m).__name__}]})
    return out


def output_messages(result: CreateResult) -> list[dict[str, Any]]:
    """A ``CreateResult`` as ``gen_ai.output.messages``."""
    parts = _content_parts(result.content)
    if result.thought:
        parts.insert(0, {"type": "reasoning", "content": result.thought})
    return [{"role": "assistant", "parts": parts, "finish_reason": result.finish_reason}]


def tool_definitions(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Tool objects or tool schemas as ``gen_ai.tool.definitions``."""
    out = []
    for tool in tools:
        schema = tool if isinstance(tool, dict) else getattr(tool, "schema", None)
        if isinstance(schema, dict):
            out.append({"type": "function", **schema})
    return out
