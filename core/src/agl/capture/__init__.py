"""Capture: the current rollout, spans, rewards, the buffered writer, and what every integration shares.

The shared part: :class:`ErrorGuard` / :func:`error_guard` / :func:`guarded` keep agl's own
failures away from the agent, and :func:`env_flag` reads the ``AGL_<FRAMEWORK>_INSTRUMENT``
switches.
"""

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
from agl.capture.flags import env_flag
from agl.capture.guard import ErrorGuard, error_guard, guarded
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
    "env_flag",
    "error_guard",
    "guarded",
    "production_writer",
    "span",
    "use_rollout",
]
