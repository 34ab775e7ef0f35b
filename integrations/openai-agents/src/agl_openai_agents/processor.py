"""A TracingProcessor that turns the Agents SDK's spans into agl spans."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.tracing import Span as SdkSpan
from agents.tracing import Trace, TracingProcessor
from agents.tracing.span_data import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    GuardrailSpanData,
    HandoffSpanData,
    ResponseSpanData,
    TurnSpanData,
)

from agl.capture import RolloutContext, capture_context, current_span_id
from agl.schema import Span, now

from agl_openai_agents import _convert, _response_ids
from agl_openai_agents._guard import report

_REQUEST_SETTINGS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


_KEPT = (GenerationSpanData, ResponseSpanData, FunctionSpanData, AgentSpanData, HandoffSpanData, GuardrailSpanData)


@dataclass(slots=True)
class _Open:
    start: float
    parent_id: str | None
    agent: str | None
    ctx: RolloutContext
    kept: bool


class AglTracingProcessor(TracingProcessor):
    """Records Agents SDK spans into agl; add it with ``agents.add_trace_processor``.

    >>> from agents import add_trace_processor
    >>> add_trace_processor(AglTracingProcessor())

    It sits next to the user's other processors and never replaces them. Each
    generation or response span becomes an ``llm`` span carrying the name of the
    agent whose turn it belongs to; function spans become ``tool`` spans, agent
    spans ``agent`` spans, handoffs and guardrails ``custom`` spans. The rollout is
    the one current when the SDK's trace started (:func:`agl.current_rollout`).
    """

    def __init__(self) -> None:
        self.enabled = True
        """Set to False to make the processor ignore everything (the SDK cannot remove one)."""
        self._open: dict[str, _Open] = {}
        self._traces: dict[str, tuple[RolloutContext, str | None]] = {}
        try:
            _response_ids.install()
        except Exception as exc:
            report("install the chat completions response id hook", exc)

    # -- TracingProcessor -----------------------------------------------------------

    def on_trace_start(self, trace: Trace) -> None:
        if not self.enabled:
            return
        try:
            self._traces[trace.trace_id] = (capture_context(), current_span_id())
        except Exception as exc:
            report("on_trace_start", exc)

    def on_trace_end(self, trace: Trace) -> None:
        self._traces.pop(trace.trace_id, None)

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        if not self.enabled:
            return
        try:
            data = span.span_data
            parent = self._open.get(span.parent_id) if span.parent_id else None
            if isinstance(data, AgentSpanData):
                agent: str | None = data.name
            elif isinstance(data, TurnSpanData):
                agent = data.agent_name or (parent.agent if parent else None)
            else:
                agent = parent.agent if parent else None
            if parent is not None:
                # Children of a span agl does not keep (a turn) hang from its nearest kept ancestor.
                ctx, parent_id = parent.ctx, (span.parent_id if parent.kept else parent.parent_id)
            else:
                ctx, parent_id = self._traces.get(span.trace_id) or (capture_context(), current_span_id())
            self._open[span.span_id] = _Open(now(), parent_id, agent, ctx, isinstance(data, _KEPT))
        except Exception as exc:
            report("on_span_start", exc)

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        opened = self._open.pop(span.span_id, None)
        try:
            if opened is None:
                return
            record = self._convert(span, opened)
            if record is None:
                return
            ctx = opened.ctx
            record.rollout_id = ctx.rollout_id
            record.trace_id = ctx.trace_id
            record.seq = ctx.next_seq()
            ctx.put(record)
        except Exception as exc:
            report("on_span_end", exc)

    def shutdown(self) -> None:
        self._open.clear()
        self._traces.clear()

    def force_flush(self) -> None:
        pass

    # -- conversion -------------------------------------------------------------------

    def _convert(self, span: SdkSpan[Any], opened: _Open) -> Span | None:
        data = span.span_data
        attrs: dict[str, Any] = {}
        if opened.agent:
            attrs["gen_ai.agent.name"] = opened.agent
        if isinstance(data, GenerationSpanData):
            kind, name = "llm", self._generation(data, span.span_id, attrs)
        elif isinstance(data, ResponseSpanData):
            kind, name = "llm", self._response(data, attrs)
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
        return Span(
            span_id=span.span_id,
            parent_id=opened.parent_id,
            name=name,
            kind=kind,
            start_time=opened.start,
            end_time=now(),
            status="error" if error else "ok",
            attributes=attrs,
        )

    @staticmethod
    def _generation(data: GenerationSpanData, span_id: str, attrs: dict[str, Any]) -> str:
        attrs["gen_ai.operation.name"] = "chat"
        model = str(data.model) if data.model else None
        if model:
            attrs["gen_ai.request.model"] = model
        config = data.model_config or {}
        for key, attr in _REQUEST_SETTINGS.items():
            if config.get(key) is not None:
                attrs[attr] = config[key]
        if data.input is not None:
            attrs["gen_ai.input.messages"] = _convert.chat_messages(data.input)
        if data.output is not None:
            if data.output and isinstance(data.output[0], dict) and data.output[0].get("object") == "response":
                attrs["gen_ai.output.messages"] = _convert.response_items(data.output[0].get("output"))
            else:
                attrs["gen_ai.output.messages"] = _convert.chat_messages(data.output)
        usage = data.usage or {}
        if usage.get("input_tokens") is not None:
            attrs["gen_ai.usage.input_tokens"] = usage["input_tokens"]
        if usage.get("output_tokens") is not None:
            attrs["gen_ai.usage.output_tokens"] = usage["output_tokens"]
        response_id = _response_ids.pop(span_id)
        if response_id:
            attrs["gen_ai.response.id"] = response_id
        return f"chat {model}" if model else "chat"

    @staticmethod
    def _response(data: ResponseSpanData, attrs: dict[str, Any]) -> str:
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
            attrs["gen_ai.output.messages"] = _convert.response_items(response.output)
            if response.usage is not None:
                attrs["gen_ai.usage.input_tokens"] = response.usage.input_tokens
                attrs["gen_ai.usage.output_tokens"] = response.usage.output_tokens
            for key in ("temperature", "top_p"):
                if getattr(response, key, None) is not None:
                    attrs[_REQUEST_SETTINGS[key]] = getattr(response, key)
            if response.max_output_tokens is not None:
                attrs["gen_ai.request.max_tokens"] = response.max_output_tokens
        if data.input is not None:
            attrs["gen_ai.input.messages"] = _convert.response_items(data.input)
        return f"chat {model}" if model else "chat"
