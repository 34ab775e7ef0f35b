"""Chat messages in the shapes frameworks and the gateway record them: normalised, extracted, compared."""

from __future__ import annotations

import json
from typing import Any

_ROLE_ALIASES = {
    "human": "user",
    "ai": "assistant",
    "AIMessage": "assistant",
    "HumanMessage": "user",
    "SystemMessage": "system",
    "developer": "system",
    "model": "assistant",
}


def optional_str(value: Any) -> str | None:
    """``value`` as a string; None for None or an empty string (how an unset attribute reads)."""
    return None if value is None or value == "" else str(value)


def json_attribute(value: Any) -> Any:
    """A span attribute that may hold JSON, decoded (OpenTelemetry exporters store structured values as JSON strings).

    A string that is not JSON, and any other value, comes back as it is.
    """
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("content"))
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    if isinstance(content, dict):
        return _content_text(content.get("text", content.get("content")))
    return str(content)


def normalize_messages(messages: Any) -> list[tuple[str, str]]:
    """Chat messages in any common shape as ``(role, text)`` pairs, for comparing a span with a call.

    Accepts OpenAI chat messages (``content`` a string or a list of parts), OpenTelemetry
    GenAI messages (``parts`` with ``content``), LangChain dumps (``type`` human/ai) and
    Responses API input (a string, or items with ``role`` and ``content``). A Responses
    ``function_call`` item is an assistant turn (consecutive ones are one turn, as a chat
    model makes them and as the integrations record them) and a ``function_call_output``
    a tool turn. Other items with no role (reasoning) keep their type as role. An Anthropic
    user message's ``tool_result`` blocks are tool turns, in order with its other blocks
    (as the gateway renders them).
    """
    if messages is None:
        return []
    if isinstance(messages, str):
        return [("user", messages.strip())]
    out = []
    after_call = False  # the last item was a Responses function_call
    for m in messages:
        if isinstance(m, str):
            out.append(("user", m.strip()))
            after_call = False
            continue
        if not isinstance(m, dict):
            continue
        if m.get("type") == "function_call" and "role" not in m:
            if not after_call:
                out.append(("assistant", ""))
            after_call = True
            continue
        after_call = False
        if m.get("type") == "function_call_output" and "role" not in m:
            out.append(("tool", ""))
            continue
        role = m.get("role") or m.get("type") or ""
        role = _ROLE_ALIASES.get(role, role)
        if role == "user" and _has_tool_results(m.get("content")):
            out += _tool_result_turns(m["content"])
            continue
        text = _content_text(m["parts"]) if "parts" in m and "content" not in m else _content_text(m.get("content"))
        out.append((role, text.strip()))
    return out


def _has_tool_results(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _tool_result_turns(blocks: list) -> list[tuple[str, str]]:
    """An Anthropic user message's blocks as turns: each ``tool_result`` a tool turn, other runs user turns."""
    out: list[tuple[str, str]] = []
    run: list = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if run:
                out.append(("user", _content_text(run).strip()))
                run = []
            out.append(("tool", _content_text(block.get("content")).strip()))
        else:
            run.append(block)
    if run:
        out.append(("user", _content_text(run).strip()))
    return out


def request_messages(request: dict) -> Any:
    """The prompt of a gateway request: chat ``messages`` (after an Anthropic request's ``system``),
    or the Responses API's ``instructions`` + ``input``."""
    if "messages" in request:
        system = request.get("system")
        if system and isinstance(request["messages"], list):
            return [{"role": "system", "content": system}, *request["messages"]]
        return request["messages"]
    if "input" in request:
        items = request["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items)
        if request.get("instructions"):
            items = [{"role": "system", "content": request["instructions"]}, *items]
        return items
    if "prompt" in request and isinstance(request["prompt"], str):
        return [{"role": "user", "content": request["prompt"]}]
    return None


def response_text(response: dict) -> str | None:
    """The text of a gateway response (chat completion, completion, Responses API or Anthropic Message)."""
    choices = response.get("choices")
    if choices:
        first = choices[0]
        if "message" in first:
            return _content_text(first["message"].get("content"))
        if "text" in first:
            return first["text"]
    if isinstance(response.get("output_text"), str):
        return response["output_text"]
    if isinstance(response.get("output"), list):
        return "".join(_content_text(item.get("content")) for item in response["output"] if isinstance(item, dict))
    if response.get("type") == "message" and isinstance(response.get("content"), list):
        return _content_text([b for b in response["content"] if isinstance(b, dict) and b.get("type") == "text"])
    return None


def messages_list(messages: Any) -> list[dict] | None:
    """Messages as a list of dicts (what :attr:`~agl.schema.Transition.prompt_messages` holds); None stays None.

    A string is one user message; a list item that is not a dict becomes a user message of its text.
    """
    if messages is None:
        return None
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [m if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in messages]


def output_text(messages: Any) -> str | None:
    """The text a span's output messages hold: its assistant turns joined (else the last message's text).

    A string is the text itself; None stays None.
    """
    if messages is None:
        return None
    if isinstance(messages, str):
        return messages
    pairs = normalize_messages(messages)
    return "".join(text for role, text in pairs if role in ("assistant", "")) or (pairs[-1][1] if pairs else None)
