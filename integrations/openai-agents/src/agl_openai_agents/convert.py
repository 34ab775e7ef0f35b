"""Agents SDK spans → agl spans; OpenAI chat messages and Responses API items → GenAI message shapes.

Generation and response spans become ``llm`` spans, function spans ``tool`` spans,
agent spans ``agent`` spans, handoffs and guardrails ``custom`` spans; turns, tasks,
MCP listings and speech are structure agl does not keep (:data:`KEPT`).
"""

from __future__ import annotations

from typing import Any

from agents.tracing import Span as SdkSpan
from agents.tracing.span_data import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    GuardrailSpanData,
    HandoffSpanData,
    ResponseSpanData,
)

from agl.schema import Span, now
from agl_openai_agents._requests import Request

KEPT = (GenerationSpanData, ResponseSpanData, FunctionSpanData, AgentSpanData, HandoffSpanData, GuardrailSpanData)
"""The span data types :func:`to_agl` converts; spans of other types are dropped and their children re-parented."""

_REQUEST_SETTINGS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


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
            parts.append(
                {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}
            )
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
            part = {
                "type": "tool_call",
                "id": item.get("call_id"),
                "name": item.get("name"),
                "arguments": item.get("arguments"),
            }
            if out and out[-1]["role"] == "assistant" and all(p["type"] == "tool_call" for p in out[-1]["parts"]):
                out[-1]["parts"].append(part)
            else:
                out.append({"role": "assistant", "parts": [part]})
        elif kind == "function_call_output":
            out.append(
                {
                    "role": "tool",
                    "parts": [
                        {"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}
                    ],
                }
            )
        elif kind == "reasoning":
            summary = " ".join(s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict))
            out.append({"role": "assistant", "parts": [{"type": "reasoning", "content": summary}]})
        elif "role" in item:
            out.append({"role": item["role"], "parts": _parts(item.get("content"))})
        else:
            out.append({"role": "unknown", "parts": [{"type": str(kind)}]})
    return out


def to_agl(
    span: SdkSpan[Any],
    start: float,
    parent_id: str | None,
    agent: str | None,
    response_id: str | None = None,
    request: Request | None = None,
) -> Span | None:
    """The agl span of an ended SDK span, or None for span types agl does not keep.

    ``start`` is when agl saw the span start, ``parent_id`` its nearest kept ancestor,
    ``agent`` the agent whose turn it belongs to, ``response_id`` the completion id of
    a Chat Completions generation (which the SDK's span leaves out), ``request`` what
    a Responses API call asked for (used where the span has no input: a failed
    call, so it still carries its prompt and joins the gateway's record). The rollout id,
    trace id and sequence number are left for the caller to fill in.
    """
    data = span.span_data
    attrs: dict[str, Any] = {}
    if agent:
        attrs["gen_ai.agent.name"] = agent
    if isinstance(data, GenerationSpanData):
        kind, name = "llm", _generation(data, response_id, attrs)
    elif isinstance(data, ResponseSpanData):
        failed = span.error
        kind, name = "llm", _response(data, attrs, request if failed else None, not _redacted(failed))
    elif isinstance(data, FunctionSpanData):
        kind, name = "tool", f"execute_tool {data.name}"
        attrs["gen_ai.operation.name"] = "execute_tool"
        attrs["gen_ai.tool.name"] = data.name
        if data.input is not None:
            attrs["gen_ai.tool.call.arguments"] = data.input
        if data.output is not None:
            attrs["gen_ai.tool.call.result"] = data.output if isinstance(data.output, str) else str(data.output)
    elif isinstance(data, AgentSpanData):
        kind, name = "agent", f"invoke_agent {data.name}"
        attrs["gen_ai.operation.name"] = "invoke_agent"
        attrs["agl.agent.handoffs"] = list(data.handoffs or [])
        attrs["agl.agent.tools"] = list(data.tools or [])
        if data.output_type:
            attrs["agl.agent.output_type"] = data.output_type
    elif isinstance(data, HandoffSpanData):
        kind, name = "custom", f"handoff {data.from_agent} -> {data.to_agent}"
        attrs["gen_ai.operation.name"] = "handoff"
        attrs["agl.handoff.from_agent"] = data.from_agent
        attrs["agl.handoff.to_agent"] = data.to_agent
    elif isinstance(data, GuardrailSpanData):
        kind, name = "custom", f"guardrail {data.name}"
        attrs["agl.guardrail.name"] = data.name
        attrs["agl.guardrail.triggered"] = data.triggered
    else:
        return None  # turns, tasks, MCP listings, speech: structure agl does not need
    error = span.error
    if error:
        attrs["error.type"] = str(error.get("message") or "error")
        detail = _error_detail(error)
        if detail:
            attrs["error.message"] = detail
    return Span(
        span_id=span.span_id,
        parent_id=parent_id,
        name=name,
        kind=kind,
        start_time=start,
        end_time=now(),
        status="error" if error else "ok",
        attributes=attrs,
    )


def _generation(data: GenerationSpanData, response_id: str | None, attrs: dict[str, Any]) -> str:
    attrs["gen_ai.operation.name"] = "chat"
    model = str(data.model) if data.model else None
    if model:
        attrs["gen_ai.request.model"] = model
    config = data.model_config or {}
    for key, attr in _REQUEST_SETTINGS.items():
        if config.get(key) is not None:
            attrs[attr] = config[key]
    if data.input is not None:
        attrs["gen_ai.input.messages"] = chat_messages(data.input)
    if data.output is not None:
        if data.output and isinstance(data.output[0], dict) and data.output[0].get("object") == "response":
            attrs["gen_ai.output.messages"] = response_items(data.output[0].get("output"))
        else:
            attrs["gen_ai.output.messages"] = chat_messages(data.output)
    usage = data.usage or {}
    if usage.get("input_tokens") is not None:
        attrs["gen_ai.usage.input_tokens"] = usage["input_tokens"]
    if usage.get("output_tokens") is not None:
        attrs["gen_ai.usage.output_tokens"] = usage["output_tokens"]
    if response_id:
        attrs["gen_ai.response.id"] = response_id
    return f"chat {model}" if model else "chat"


def _response(
    data: ResponseSpanData, attrs: dict[str, Any], request: Request | None = None, with_messages: bool = True
) -> str:
    attrs["gen_ai.operation.name"] = "chat"
    attrs["agl.api"] = "responses"
    response = data.response
    model = None
    if response is not None:
        attrs["gen_ai.response.id"] = response.id
        model = response.model
        if model:
            attrs["gen_ai.request.model"] = model
            attrs["gen_ai.response.model"] = model
        if response.instructions:
            attrs["gen_ai.system_instructions"] = (
                response.instructions if isinstance(response.instructions, str) else str(response.instructions)
            )
        attrs["gen_ai.output.messages"] = response_items(response.output)
        if response.usage is not None:
            attrs["gen_ai.usage.input_tokens"] = response.usage.input_tokens
            attrs["gen_ai.usage.output_tokens"] = response.usage.output_tokens
        for key in ("temperature", "top_p"):
            if getattr(response, key, None) is not None:
                attrs[_REQUEST_SETTINGS[key]] = getattr(response, key)
        if response.max_output_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = response.max_output_tokens
    if data.input is not None:
        attrs["gen_ai.input.messages"] = response_items(data.input)
    elif request is not None:
        model = model or _from_request(request, attrs, with_messages=with_messages)
    return f"chat {model}" if model else "chat"


_REDACTED = "Error details are redacted."
"""What the SDK (0.24) puts in an error span instead of the error when sensitive data is left out."""


def _redacted(error: dict[str, Any] | None) -> bool:
    """Whether the SDK left the error's details out (``trace_include_sensitive_data=False``)."""
    data = error.get("data") if error else None
    return isinstance(data, dict) and data.get("error") == _REDACTED


def _error_detail(error: dict[str, Any] | None) -> str | None:
    """The error's text, or None where there is none or the SDK redacted it."""
    data = error.get("data") if error else None
    detail = data.get("error") if isinstance(data, dict) else None
    return str(detail) if detail and detail != _REDACTED else None


def _from_request(request: Request, attrs: dict[str, Any], *, with_messages: bool) -> str | None:
    """Fill a failed call's response span from its request; return the model.

    The instructions lead the input messages as a system message, as in the request
    the gateway recorded, so the span joins that record by its prompt. Messages are
    left out where the run leaves sensitive data out of its spans.
    """
    if request.model and "gen_ai.request.model" not in attrs:
        attrs["gen_ai.request.model"] = request.model
    if not with_messages:
        return request.model
    messages = response_items(request.input) if request.input is not None else []
    if request.instructions:
        attrs.setdefault("gen_ai.system_instructions", request.instructions)
        messages.insert(0, {"role": "system", "parts": [{"type": "text", "content": request.instructions}]})
    attrs["gen_ai.input.messages"] = messages
    return request.model
