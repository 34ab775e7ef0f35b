"""LangChain objects to the JSON agl stores: messages in OpenAI chat format.

Messages are stored the way the gateway sees requests (``role``, ``content``,
``tool_calls`` with JSON-string ``arguments``, ``tool_call_id``), so a span's
``gen_ai.input.messages`` can be compared with the gateway's record of the same
call and exported for SFT without another conversion. These functions run on
every callback, so they touch plain attributes only and never validate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "function",
    "developer": "developer",
    "AIMessageChunk": "assistant",
    "HumanMessageChunk": "user",
    "SystemMessageChunk": "system",
    "ToolMessageChunk": "tool",
}

_SCALARS = (str, int, float, bool, type(None))


def to_json(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON-safe data: containers are copied, anything else becomes its repr."""
    if isinstance(value, _SCALARS):
        return value
    if _depth > 20:
        return repr(value)
    if isinstance(value, BaseMessage):
        return message_to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, _depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return to_json(dump(mode="json"), _depth + 1)
        except Exception:
            pass
    return repr(value)


def tool_call_to_openai(call: Mapping[str, Any]) -> dict[str, Any]:
    """A LangChain tool call (``name``, ``args``, ``id``) in OpenAI form."""
    args = call.get("args")
    try:
        arguments = json.dumps(args, ensure_ascii=False)
    except (TypeError, ValueError):
        arguments = json.dumps(to_json(args), ensure_ascii=False)
    return {"id": call.get("id"), "type": "function", "function": {"name": call.get("name"), "arguments": arguments}}


def message_to_dict(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as an OpenAI chat message."""
    mtype = message.type
    role = _ROLES.get(mtype) or getattr(message, "role", None) or mtype
    content = message.content
    out: dict[str, Any] = {"role": role, "content": content if isinstance(content, str) else to_json(content)}
    if message.name:
        out["name"] = message.name
    # Only the message types that have these fields are asked for them: a missing
    # attribute on a pydantic model costs an exception, several µs per message.
    if role == "assistant":
        tool_calls = getattr(message, "tool_calls", None)
        if tool_calls:
            out["tool_calls"] = [tool_call_to_openai(c) for c in tool_calls]
        invalid = getattr(message, "invalid_tool_calls", None)
        if invalid:
            out["invalid_tool_calls"] = to_json(invalid)
    elif role == "tool":
        tool_call_id = getattr(message, "tool_call_id", None)
        if tool_call_id:
            out["tool_call_id"] = tool_call_id
    return out


def messages_to_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """A prompt (a list of messages) in OpenAI chat format."""
    return [message_to_dict(m) for m in messages]
