"""OpenTelemetry spans (GenAI semantic conventions or OpenInference) → agl spans.

One function, :func:`to_agl`, used by the in-process span processor and by the
OTLP/HTTP endpoint alike. Spans that are neither GenAI nor OpenInference give None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agl.schema import Span

_LLM_OPERATIONS = {"chat", "text_completion", "generate_content", "completion"}
_AGENT_OPERATIONS = {"invoke_agent", "create_agent", "invoke_workflow"}
_RENAMED = {
    "gen_ai.usage.prompt_tokens": "gen_ai.usage.input_tokens",
    "gen_ai.usage.completion_tokens": "gen_ai.usage.output_tokens",
    "gen_ai.system": "gen_ai.provider.name",
}
_JSON_VALUED = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
)
_OI_KIND = {
    "LLM": "llm",
    "TOOL": "tool",
    "AGENT": "agent",
    "CHAIN": "custom",
    "RETRIEVER": "tool",
    "EMBEDDING": "custom",
}
_OI_MESSAGE = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_OI_CONTENT = re.compile(r"^contents\.(\d+)\.message_content\.(type|text)$")


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _genai(name: str, attributes: Mapping[str, Any], agent: str | None) -> tuple[str, dict[str, Any]]:
    attrs: dict[str, Any] = {}
    for key, value in attributes.items():
        key = _RENAMED.get(key, key)
        attrs[key] = _maybe_json(value) if key in _JSON_VALUED else value
    if agent and "gen_ai.agent.name" not in attrs:
        attrs["gen_ai.agent.name"] = agent
    op = attrs.get("gen_ai.operation.name")
    if op in _LLM_OPERATIONS:
        return "llm", attrs
    if op == "execute_tool":
        return "tool", attrs
    if op in _AGENT_OPERATIONS:
        return "agent", attrs
    return "custom", attrs


_OI_RENAMES = {
    "llm.model_name": "gen_ai.request.model",
    "llm.token_count.prompt": "gen_ai.usage.input_tokens",
    "llm.token_count.completion": "gen_ai.usage.output_tokens",
    "tool.name": "gen_ai.tool.name",
}
"""OpenInference attributes with a GenAI convention of their own, renamed as they are."""


def _openinference(attributes: Mapping[str, Any], agent: str | None) -> tuple[str, dict[str, Any]]:
    kind = _OI_KIND.get(str(attributes.get("openinference.span.kind", "")).upper(), "custom")
    attrs: dict[str, Any] = {"agl.openinference.span_kind": attributes.get("openinference.span.kind")}
    messages: dict[str, dict[int, dict[str, Any]]] = {"input": {}, "output": {}}
    for key, value in attributes.items():
        m = _OI_MESSAGE.match(key)
        if m:
            direction, index, field = m.group(1), int(m.group(2)), m.group(3)
            msg = messages[direction].setdefault(index, {"role": None, "parts": []})
            if field == "role":
                msg["role"] = value
            elif field == "content":
                msg["parts"].append({"type": "text", "content": value})
            elif field.startswith("tool_calls."):
                _oi_tool_call(msg, field, value)
            elif (c := _OI_CONTENT.match(field)) is not None:
                msg.setdefault("contents", {}).setdefault(int(c.group(1)), {})[c.group(2)] = value
            continue
        renamed = _OI_RENAMES.get(key)
        if renamed is not None:
            attrs[renamed] = value
        elif key == "llm.provider" or key == "llm.system":
            attrs.setdefault("gen_ai.provider.name", value)
        elif key == "input.value":
            attrs["agl.input"] = value
            if kind == "tool":
                attrs["gen_ai.tool.call.arguments"] = value
        elif key == "output.value":
            attrs["agl.output"] = value
            if kind == "tool":
                attrs["gen_ai.tool.call.result"] = value
            elif kind == "llm":
                body = _maybe_json(value)
                if isinstance(body, dict) and isinstance(body.get("id"), str):
                    attrs["gen_ai.response.id"] = body["id"]  # the raw response, as OpenAI instrumentations record it
        elif key in ("agent.name", "graph.node.id") and kind == "agent":
            attrs["gen_ai.agent.name"] = value
        elif key.startswith("gen_ai."):
            attrs[key] = value
    for direction in ("input", "output"):
        if messages[direction]:
            attrs[f"gen_ai.{direction}.messages"] = [
                _oi_texts(messages[direction][i]) for i in sorted(messages[direction])
            ]
    if agent and "gen_ai.agent.name" not in attrs:
        attrs["gen_ai.agent.name"] = agent
    return kind, attrs


def _oi_texts(msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` with its text ``message.contents`` (the list form of ``message.content``, as the Anthropic
    instrumentation records blocks) as text parts, in their order, before its tool calls."""
    contents = msg.pop("contents", {})
    texts = [
        contents[j] for j in sorted(contents) if contents[j].get("type", "text") == "text" and "text" in contents[j]
    ]
    msg["parts"][:0] = [{"type": "text", "content": c["text"]} for c in texts]
    return msg


def _oi_tool_call(msg: dict[str, Any], field: str, value: Any) -> None:
    # llm.output_messages.0.message.tool_calls.0.tool_call.function.name / .arguments / .id
    parts = field.split(".")
    if len(parts) < 4:
        return
    index = int(parts[1])
    calls = [p for p in msg["parts"] if p.get("type") == "tool_call"]
    while len(calls) <= index:
        call = {"type": "tool_call"}
        msg["parts"].append(call)
        calls.append(call)
    leaf = parts[-1]
    calls[index][
        "name" if leaf == "name" else "arguments" if leaf == "arguments" else "id" if leaf == "id" else leaf
    ] = value


def is_relevant(attributes: Mapping[str, Any]) -> bool:
    """Whether a span with these attributes is one agl turns into an agl span."""
    if "openinference.span.kind" in attributes:
        return True
    return any(key.startswith("gen_ai.") for key in attributes)


def to_agl(
    *,
    name: str,
    attributes: Mapping[str, Any],
    span_id: str,
    parent_id: str | None,
    start_ns: int,
    end_ns: int | None,
    status: str = "unset",
    agent: str | None = None,
) -> Span | None:
    """An agl span for one OpenTelemetry span, or None if it is neither GenAI nor OpenInference.

    ``agent`` is the name of the nearest enclosing agent, given to spans that name none.
    """
    if "openinference.span.kind" in attributes:
        kind, attrs = _openinference(attributes, agent)
    elif is_relevant(attributes):
        kind, attrs = _genai(name, attributes, agent)
    else:
        return None
    return Span(
        span_id=span_id,
        parent_id=parent_id,
        name=name,
        kind=kind,  # type: ignore[arg-type]
        start_time=start_ns / 1e9,
        end_time=end_ns / 1e9 if end_ns else None,
        status=status if status in ("ok", "error", "unset") else "unset",  # type: ignore[arg-type]
        attributes=attrs,
    )
