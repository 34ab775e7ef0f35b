"""Keep agl's own failures away from the user's agent: log once per place, count, go on.

Every integration wraps its capture work so that a bug or an outage in agl never
changes what the agent does. One guard per integration, shared by its modules::

    guard = error_guard("agl_autogen")
    try:
        ...capture work...
    except Exception as exc:
        guard.report("create", exc)

or, the same in one line::

    with guard.catching("create"):
        ...capture work...

or, for the methods of an object that owns a guard (a callback handler)::

    class Handler:
        def __init__(self):
            self.error_guard = ErrorGuard("agl_langchain")

        @guarded
        def on_llm_end(self, response): ...
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from agl.capture.context import emit_span
from agl.capture.flags import env_flag
from agl.schema import Span


class ErrorGuard:
    """Counts internal errors by place and logs the first one of each place, with its traceback."""

    def __init__(self, name: str):
        self.name = name
        self.errors: Counter[str] = Counter()
        """Internal errors by place, for tests and diagnostics; the agent never sees them."""
        self._log = logging.getLogger(name)
        self._lock = threading.Lock()

    def report(self, where: str, exc: BaseException) -> None:
        """Count an internal error at ``where``; log it (a warning with traceback) the first time that place fails."""
        with self._lock:
            self.errors[where] += 1
            first = self.errors[where] == 1
        if first:
            self._log.warning(
                "%s: %s failed (%s: %s); the agent is unaffected, later failures here are only counted",
                self.name,
                where,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
        else:
            self._log.debug("%s: %s failed again: %r", self.name, where, exc)

    @property
    def total(self) -> int:
        """Internal errors of every place together."""
        return sum(self.errors.values())

    def catching(self, where: str) -> _Catching:
        """A context manager that reports an exception raised inside it at ``where`` instead of raising it."""
        return _Catching(self, where)

    def instrument_if_on(self, name: str, instrument: Callable[[], object]) -> bool:
        """Call ``instrument()`` if the environment variable ``name`` is on (see :meth:`env_flag`); whether it did.

        What an integration's zero-line ``autoload`` does at interpreter start.
        """
        if not self.env_flag(name):
            return False
        instrument()
        return True

    def env_flag(self, name: str) -> bool:
        """:func:`agl.capture.env_flag`, never raising: a value it refuses is reported (once) and read as off."""
        try:
            return env_flag(name)
        except ValueError as exc:
            self.report(name, exc)
            return False

    def emit(self, span: Span) -> None:
        """:func:`agl.emit_span`, never raising."""
        try:
            emit_span(span)
        except Exception as exc:
            self.report("emit_span", exc)


class _Catching:
    """What :meth:`ErrorGuard.catching` returns (a class, not a generator: it sits on the capture path)."""

    __slots__ = ("_guard", "_where")

    def __init__(self, guard: ErrorGuard, where: str):
        self._guard = guard
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        self._guard.report(self._where, exc)
        return True


_guards: dict[str, ErrorGuard] = {}
_guards_lock = threading.Lock()


def error_guard(name: str) -> ErrorGuard:
    """The one :class:`ErrorGuard` named ``name`` (an integration's package name), made on first use.

    Like :func:`logging.getLogger`: every module of an integration asks for its guard
    by name and gets the same object, so its ``errors`` count every place.
    """
    guard = _guards.get(name)
    if guard is None:
        with _guards_lock:
            guard = _guards.setdefault(name, ErrorGuard(name))
    return guard


class HasErrorGuard(Protocol):
    """An object whose methods :func:`guarded` protects."""

    error_guard: ErrorGuard


F = TypeVar("F", bound=Callable[..., Any])


def guarded(method: F) -> F:
    """Decorate a method whose exceptions must never reach the caller (the agent's framework).

    An exception (not a ``BaseException`` such as ``KeyboardInterrupt``) is reported to
    ``self.error_guard`` under the method's name and the method returns None. The
    wrapper adds one ``try`` to each call, nothing else.
    """
    where = method.__name__

    @functools.wraps(method)
    def wrapper(self: HasErrorGuard, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as exc:
            self.error_guard.report(where, exc)

    return wrapper  # type: ignore[return-value]
