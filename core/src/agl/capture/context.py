"""The current rollout, and the capture API that integrations and agents call.

The current rollout lives in a context variable, so it follows asyncio tasks and
anything run with ``contextvars.copy_context()``. A bare ``threading.Thread``
does not inherit context variables; for that case, when exactly one rollout is
active in the process, it is the current one everywhere.

Outside any rollout, observations are production traffic: they are written with
no rollout id to the store named by ``AGL_STORE_URL`` (or ``.agl/agl.db``), and
can be rewarded later by span id. In a process started by ``agl run`` (which sets
``AGL_ROLLOUT_ID``) they belong to that rollout instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agl.capture.writer import BufferedWriter
from agl.env import ROLLOUT_ID
from agl.schema import Reward, Span, SpanKind, Task, new_id, now


@dataclass
class RolloutContext:
    """What an agent needs to know about the rollout it is running in."""

    rollout_id: str | None
    """The rollout's id; None for production traffic."""
    task: Task | None = None
    """The task being run (None outside a claimed rollout)."""
    base_url: str | None = None
    """The gateway URL for this rollout (OpenAI-compatible, ends in ``/v1``)."""
    model: str = "agl-policy"
    """The model name to ask the gateway for."""
    api_key: str = "agl"
    """The key to send the gateway: the rollout's own key when the runner has one."""
    resources: dict[str, Any] = field(default_factory=dict)
    """The rollout's resources: the runner's, those of its mode, then the rollout's own (prompts an algorithm chose)."""
    writer: BufferedWriter | None = None
    """Where the rollout's spans and rewards go; None: the process's production writer."""
    trace_id: str = field(default_factory=new_id)
    """The trace id every span of the rollout shares."""
    _seq: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def next_seq(self) -> int:
        """The next number in the rollout's order of spans and rewards (0, 1, 2…)."""
        return next(self._seq)

    def put(self, item: Span | Reward) -> None:
        """Queue ``item`` for the store, as it is (see :meth:`record` to fill in the rollout's ids first)."""
        (self.writer or production_writer()).put(item)

    def record(self, span: Span) -> Span:
        """Put ``span`` in this rollout: its rollout id, trace id and next seq filled in, then queued."""
        span.rollout_id = self.rollout_id
        span.trace_id = self.trace_id
        span.seq = self.next_seq()
        self.put(span)
        return span


_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agl_rollout", default=None)
_current_span: contextvars.ContextVar[str | None] = contextvars.ContextVar("agl_span", default=None)
_active: dict[int, tuple[RolloutContext, int]] = {}  # id → (context, how many use_rollout blocks hold it)
_active_lock = threading.Lock()
_production: RolloutContext | None = None
_production_lock = threading.Lock()


def current_rollout() -> RolloutContext | None:
    """The rollout this code runs in, or None outside any rollout."""
    ctx = _current.get()
    if ctx is not None:
        return ctx
    with _active_lock:
        if len(_active) == 1:
            return next(iter(_active.values()))[0]
    return None


def capture_context() -> RolloutContext:
    """The current rollout, or the production context when there is none."""
    return current_rollout() or _production_context()


def _production_context() -> RolloutContext:
    global _production
    with _production_lock:
        if _production is None:
            # A process started by `agl run` is one rollout as a whole: AGL_ROLLOUT_ID names it.
            _production = RolloutContext(rollout_id=ROLLOUT_ID.get() or None)
        return _production


_production_writer: BufferedWriter | None = None
PRODUCTION_BATCH_SIZE = 64
"""The production writer's ``batch_size``: it writes once this many observations wait (or every
``interval_s``). A rollout's writer keeps the default 512, since a rollout ends in a flush anyway;
in a serving agent's process the batch waiting to be written is most of what capture holds at
its peak, so it writes in smaller batches instead, and holds each span packed as its store's row
(``pack_after=0``: about 1 KB a LangChain span instead of 2.4, see :mod:`agl.capture.writer`)."""


def production_writer() -> BufferedWriter:
    """The writer for observations made outside any rollout (opened on first use)."""
    global _production_writer
    with _production_lock:
        if _production_writer is None:
            from agl.store import open_store

            _production_writer = BufferedWriter(open_store(), batch_size=PRODUCTION_BATCH_SIZE, pack_after=0)
        return _production_writer


@contextlib.contextmanager
def use_rollout(ctx: RolloutContext) -> Iterator[RolloutContext]:
    """Make ``ctx`` the current rollout inside the ``with`` block."""
    token = _current.set(ctx)
    key = id(ctx)
    with _active_lock:
        _active[key] = (ctx, _active.get(key, (ctx, 0))[1] + 1)
    try:
        yield ctx
    finally:
        with _active_lock:
            held = _active[key][1] - 1
            if held:
                _active[key] = (ctx, held)
            else:
                del _active[key]
        _current.reset(token)


def current_span_id() -> str | None:
    """The id of the innermost open :func:`span`, if any."""
    return _current_span.get()


def emit_reward(value: float, name: str | None = None, *, span_id: str | None = None) -> Reward:
    """Record a reward for the current rollout (or, in production, for a span).

    Rewards emitted during a run are intermediate rewards for the ``emitted``
    credit assignment; the last one named ``reward`` is also the rollout's
    final reward unless the agent function returns one.
    """
    # Any real number (int, float, numpy or torch scalars); not bool, str or None.
    if isinstance(value, (bool, str, bytes)) or not hasattr(type(value), "__float__"):
        raise ValueError(f"value: a reward must be a real number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:  # e.g. a tensor with more than one element
        raise ValueError(f"value: a reward must be a single real number, got {value!r}: {exc}") from exc
    if not math.isfinite(value):
        raise ValueError(f"value: a reward must be finite, got {value!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    ctx = capture_context()
    reward = Reward(
        rollout_id=ctx.rollout_id,
        span_id=span_id or current_span_id(),
        name=name or "reward",
        value=value,
        seq=ctx.next_seq(),
    )
    ctx.put(reward)
    return reward


def emit_span(span: Span) -> Span:
    """Record a finished span in the current rollout, filling in rollout, trace and seq."""
    if span.parent_id is None:
        span.parent_id = current_span_id()
    return capture_context().record(span)


@contextlib.contextmanager
def span(name: str, kind: SpanKind = "custom", **attributes: Any) -> Iterator[Span]:
    """Record a span around a block; nested spans and rewards become its children.

    >>> with agl.span("retrieve", kind="tool", query=q) as s:
    ...     s.attributes["hits"] = len(hits)
    """
    record = Span(name=name, kind=kind, parent_id=current_span_id(), attributes=attributes)
    token = _current_span.set(record.span_id)
    try:
        yield record
        record.status = "ok"
    except BaseException as exc:
        record.status = "error"
        record.attributes.setdefault("error.type", type(exc).__name__)
        raise
    finally:
        _current_span.reset(token)
        record.end_time = now()
        emit_span(record)


def annotate(**attributes: Any) -> Span:
    """Record a point-in-time ``custom`` span carrying ``attributes``."""
    t = now()
    return emit_span(
        Span(name="annotation", kind="custom", start_time=t, end_time=t, status="ok", attributes=attributes)
    )
