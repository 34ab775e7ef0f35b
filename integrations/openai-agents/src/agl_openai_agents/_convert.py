"""OpenAI chat messages and Responses API items → OpenTelemetry GenAI message shapes."""

from __future__ import annotations

from typing import Any


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for item in content if isinstance(content, list) else [content]:
        if isinstance(item, dict):
            kind = item.get("type")
            text = item.get("text")
            if kind in ("text", "input_text", "output_text") or (kind is None and isinstance(text, str)):
                parts.append({"type": "text", "content": text})
            elif kind == "refusal":
                parts.append({"type": "refusal", "content": item.get("refusal")})
            else:
                parts.append({"type": str(kind)})
        else:
            parts.append({"type": "text", "content": str(item)})
    return parts


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Chat Completions messages (dicts) as ``gen_ai.*.messages``."""
    out: list[dict[str, Any]] = []
    for m in messages or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role", "unknown")
        parts = _parts(m.get("content"))
        if m.get("refusal"):
            parts.append({"type": "refusal", "content": m["refusal"]})
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
        if role == "tool":
            parts = [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m.get("content")}]
        out.append({"role": role, "parts": parts})
    return out


def response_items(items: Any) -> list[dict[str, Any]]:
    """Responses API input or output items as ``gen_ai.*.messages``.

    Consecutive function calls are gathered into one assistant message, as a chat
    model would have produced them.
    """
    if isinstance(items, str):
        return [{"role": "user", "parts": [{"type": "text", "content": items}]}]
    out: list[dict[str, Any]] = []
    for item in items or []:
        if not isinstance(item, dict):
            item = item.model_dump() if hasattr(item, "model_dump") else {}
        kind = item.get("type")
        if kind == "function_call":
            part = {"type": "tool_call", "id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")}
            if out and out[-1]["role"] == "assistant" and all(p["type"] == "tool_call" for p in out[-1]["parts"]):
                out[-1]["parts"].append(part)
            else:
                out.append({"role": "assistant", "parts": [part]})
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}]}
            )
        elif kind == "reasoning":
            summary = " ".join(s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict))
            out.append({"role": "assistant", "parts": [{"type": "reasoning", "content": summary}]})
        elif "role" in item:
            out.append({"role": item["role"], "parts": _parts(item.get("content"))})
        else:
            out.append({"role": "unknown", "parts": [{"type": str(kind)}]})
    return out
