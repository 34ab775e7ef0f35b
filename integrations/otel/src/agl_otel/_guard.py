"""Keep agl's own failures away from the user's agent: log once per place, count, go on."""

from __future__ import annotations

import logging
import threading
from collections import Counter

import agl
from agl.schema import Span

log = logging.getLogger("agl_otel")

errors: Counter[str] = Counter()
"""Internal errors by place, for tests and diagnostics; the agent never sees them."""

_lock = threading.Lock()


def report(where: str, exc: BaseException) -> None:
    """Count an internal error at ``where``; log it the first time that place fails."""
    with _lock:
        errors[where] += 1
        first = errors[where] == 1
    if first:
        log.warning("agl_otel: %s failed (%s: %s); capture goes on without it", where, type(exc).__name__, exc)


def safe_emit(span: Span) -> None:
    """:func:`agl.emit_span`, never raising."""
    try:
        agl.emit_span(span)
    except Exception as exc:
        report("emit_span", exc)
