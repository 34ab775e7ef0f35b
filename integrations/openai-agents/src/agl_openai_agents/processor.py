"""The one-line integration: a TracingProcessor that records the Agents SDK's spans into the current rollout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.tracing import Span as SdkSpan
from agents.tracing import Trace, TracingProcessor
from agents.tracing.span_data import AgentSpanData, GenerationSpanData, ResponseSpanData, TurnSpanData

from agl.capture import RolloutContext, capture_context, current_span_id, error_guard
from agl.schema import now
from agl_openai_agents import _requests, _response_ids, convert
from agl_openai_agents.export_guard import guard_default_exporter
from agl_openai_agents.supported import check_framework_version

_guard = error_guard("agl_openai_agents")


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

    It sits next to the user's other processors and never replaces them; the SDK's
    default exporter is kept from sending a rollout key, the gateway's token or the run's
    traces to OpenAI (:mod:`agl_openai_agents.export_guard`). Each
    generation or response span becomes an ``llm`` span carrying the name of the
    agent whose turn it belongs to; function spans become ``tool`` spans, agent
    spans ``agent`` spans, handoffs and guardrails ``custom`` spans. The rollout is
    the one current when the SDK's trace started (:func:`agl.current_rollout`).
    """

    def __init__(self) -> None:
        check_framework_version()
        guard_default_exporter()  # before anything is recorded: no rollout key or trace goes to OpenAI
        self.enabled = True
        """Set to False to make the processor ignore everything (the SDK cannot remove one)."""
        self._open: dict[str, _Open] = {}
        self._traces: dict[str, tuple[RolloutContext, str | None]] = {}
        with _guard.catching("install the chat completions response id hook"):
            _response_ids.install()
        with _guard.catching("install the responses request hook"):
            _requests.install()

    # -- TracingProcessor -----------------------------------------------------------

    def on_trace_start(self, trace: Trace) -> None:
        """Remember the rollout (and agl span) current when the SDK's trace starts: its spans belong there."""
        """Remember the rollout (and agl span) current when the SDK's trace starts: its spans belong there."""
        if not self.enabled:
            return
        with _guard.catching("on_trace_start"):
            self._traces[trace.trace_id] = (capture_context(), current_span_id())

    def on_trace_end(self, trace: Trace) -> None:
        """Forget the trace."""
        """Forget the trace."""
        self._traces.pop(trace.trace_id, None)

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        """Note when the span started, its parent and the agent it belongs to."""
        """Note when the span started, its parent and the agent it belongs to."""
        if not self.enabled:
            return
        with _guard.catching("on_span_start"):
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
            self._open[span.span_id] = _Open(now(), parent_id, agent, ctx, isinstance(data, convert.KEPT))

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        """Record the span, converted to an agl span (LLM calls with their response id and request), in its rollout."""
        """Record the span, converted to an agl span (LLM calls with their response id and request), in its rollout."""
        opened = self._open.pop(span.span_id, None)
        with _guard.catching("on_span_end"):
            if opened is None:
                return
            data = span.span_data
            response_id = _response_ids.pop(span.span_id) if isinstance(data, GenerationSpanData) else None
            request = _requests.pop(span.span_id) if isinstance(data, ResponseSpanData) else None
            record = convert.to_agl(span, opened.start, opened.parent_id, opened.agent, response_id, request)
            if record is not None:
                opened.ctx.record(record)

    def shutdown(self) -> None:
        """Forget every open span and trace."""
        """Forget every open span and trace."""
        self._open.clear()
        self._traces.clear()

    def force_flush(self) -> None:
        """Nothing to flush: spans go to the rollout's writer as they end."""
        """Nothing to flush: spans go to the rollout's writer as they end."""
        pass
