"""Keep agl's own failures away from the user's agent: log once per place, count, go on.

Integrations wrap every piece of capture work so that a bug or an outage in agl
never changes what the agent does::

    guard = ErrorGuard("agl_autogen")
    try:
        ...capture work...
    except Exception as exc:
        guard.report("create", exc)
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from agl.capture.context import emit_span
from agl.schema import Span


class ErrorGuard:
    """Counts internal errors by place and logs the first one of each place."""

    def __init__(self, name: str):
        self.name = name
        self.errors: Counter[str] = Counter()
        """Internal errors by place, for tests and diagnostics; the agent never sees them."""
        self._log = logging.getLogger(name)
        self._lock = threading.Lock()

    def report(self, where: str, exc: BaseException) -> None:
        """Count an internal error at ``where``; log it the first time that place fails."""
        with self._lock:
            self.errors[where] += 1
            first = self.errors[where] == 1
        if first:
            self._log.warning(
                "%s: %s failed (%s: %s); capture goes on without it", self.name, where, type(exc).__name__, exc
            )

    def emit(self, span: Span) -> None:
        """:func:`agl.emit_span`, never raising."""
        try:
            emit_span(span)
        except Exception as exc:
            self.report("emit_span", exc)
