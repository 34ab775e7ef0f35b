"""Capture: the current rollout, spans, rewards and the buffered writer."""

from agl.capture.context import (
    RolloutContext,
    annotate,
    capture_context,
    current_rollout,
    current_span_id,
    emit_reward,
    emit_span,
    production_writer,
    span,
    use_rollout,
)
from agl.capture.guard import ErrorGuard
from agl.capture.writer import BufferedWriter

__all__ = [
    "BufferedWriter",
    "ErrorGuard",
    "RolloutContext",
    "annotate",
    "capture_context",
    "current_rollout",
    "current_span_id",
    "emit_reward",
    "emit_span",
    "production_writer",
    "span",
    "use_rollout",
]
