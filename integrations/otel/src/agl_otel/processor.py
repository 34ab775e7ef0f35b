"""The one-line integration: an OpenTelemetry SpanProcessor that records GenAI and OpenInference spans into agl."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import StatusCode

from agl.capture import RolloutContext, capture_context, current_span_id, error_guard
from agl_otel.convert import to_agl

_guard = error_guard("agl_otel")

_STATUS = {StatusCode.OK: "ok", StatusCode.ERROR: "error", StatusCode.UNSET: "unset"}


def hex_id(value: int) -> str:
    """An OpenTelemetry span id as its usual 16-digit hex text."""
    return format(value, "016x")


class AglSpanProcessor(SpanProcessor):
    """Turns ended GenAI / OpenInference spans into agl spans in the current rollout.

    >>> provider.add_span_processor(AglSpanProcessor())

    Other spans only pass through it (their agent name is remembered for their
    children). The rollout is the one current when the span started
    (:func:`agl.current_rollout`); outside any rollout, spans are production traces.
    """

    def __init__(self) -> None:
        self.enabled = True
        """Set to False to make the processor ignore every span."""
        self._open: dict[int, tuple[str | None, RolloutContext, str | None]] = {}

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        """Note the span's agent (``gen_ai.agent.name``, an OpenInference agent's, else its parent's) and rollout."""
        if not self.enabled:
            return
        with _guard.catching("on_start"):
            ctx = span.get_span_context()
            parent = span.parent
            inherited = self._open.get(parent.span_id) if parent is not None else None
            attrs = span.attributes or {}
            agent = attrs.get("gen_ai.agent.name")
            if agent is None and attrs.get("openinference.span.kind") == "AGENT":
                agent = attrs.get("agent.name")
            if not isinstance(agent, str):
                agent = inherited[0] if inherited else None
            if inherited is not None:
                rollout, outer = inherited[1], None
            else:
                rollout, outer = capture_context(), current_span_id()
            self._open[ctx.span_id] = (agent, rollout, outer)

    def on_end(self, span: ReadableSpan) -> None:
        """Record the span in its rollout when :func:`agl_otel.to_agl` converts it (GenAI, OpenInference spans)."""
        if not self.enabled:
            return
        with _guard.catching("on_end"):
            ctx = span.get_span_context()
            agent, rollout, outer = self._open.pop(ctx.span_id, None) or (None, capture_context(), current_span_id())
            attrs = span.attributes or {}
            if not attrs:
                return
            parent = span.parent
            record = to_agl(
                name=span.name,
                attributes=attrs,
                span_id=hex_id(ctx.span_id),
                parent_id=hex_id(parent.span_id) if parent is not None else outer,
                start_ns=span.start_time or 0,
                end_ns=span.end_time,
                status=_STATUS.get(span.status.status_code, "unset"),
                agent=agent,
            )
            if record is not None:
                rollout.record(record)

    def shutdown(self) -> None:
        """Forget every open span."""
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing to flush here: spans go to the rollout's writer as they end. Returns True."""
        return True
