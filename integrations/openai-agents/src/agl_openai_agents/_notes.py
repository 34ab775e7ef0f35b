"""What a wrapper around the SDK noted for a span, kept until the processor asks for it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class SpanNotes(Generic[T]):
    """One value per span id, bounded: spans whose processor never asks (tracing off for that run) age out."""

    def __init__(self, most: int = 10_000) -> None:
        self._values: OrderedDict[str, T] = OrderedDict()
        self._most = most
        self._lock = threading.Lock()

    def note(self, span_id: str, value: T) -> None:
        """Keep ``value`` for ``span_id``, forgetting the oldest note past the bound."""
        with self._lock:
            self._values[span_id] = value
            if len(self._values) > self._most:
                self._values.popitem(last=False)

    def pop(self, span_id: str) -> T | None:
        """The value noted for ``span_id``, forgotten."""
        with self._lock:
            return self._values.pop(span_id, None)
