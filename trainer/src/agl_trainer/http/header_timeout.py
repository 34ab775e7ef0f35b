"""A bound on the time a client takes to send a request's headers: :func:`http_protocol`.

uvicorn (0.54) has no such setting. Its ``timeout_keep_alive`` covers the idle time between
two requests only, and the first byte of the next request cancels it; nothing at all bounds a
fresh connection. So a client that sends half a request head (or one byte of it now and then,
or nothing after connecting) holds a connection and its file descriptor for as long as it
likes: the slow-headers attack ("Slowloris"). uvicorn lists the missing timeout as wanted
(``--timeout-request-start``, encode/uvicorn#157); ASGI middleware cannot supply it, since the
app is first called once the headers are in. What uvicorn does support is an ``http`` setting
that takes a protocol class as well as a name, so :func:`http_protocol` makes a small subclass
of uvicorn's own protocol (httptools' or h11's), adding one timer:

- it starts when a connection opens (for its first request) and at the first byte of each later
  request on a kept-alive connection, so the idle wait between requests stays uvicorn's
  keep-alive timeout;
- it stops when the request's headers are in: the moment uvicorn makes the request's cycle,
  which both protocols do once the head is parsed, and which is what hands the request to the
  app. A body and an answer are not bound by it;
- when it fires first, the connection is closed (nothing is answered: the request never
  arrived).

A connection keeps one timer for all this, set again only when it fires (see
:class:`_HeaderDeadline`), so a request costs a clock reading rather than a timer.

The servers serve no WebSockets (``ws="none"``): an upgraded connection would carry on under
another protocol with the timer still set.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

DEFAULT_HEADER_TIMEOUT_S = 10.0
"""How long a client has to send a request's headers before the connection is closed."""

log = logging.getLogger(__name__)


class _HeaderDeadline:
    """Mixin over uvicorn's ``HttpToolsProtocol`` or ``H11Protocol``: see the module's docstring.

    A connection keeps at most one timer. A request's head only notes when it started
    (``_head_since``); the timer is set when none is, and when it fires it closes the connection
    if the head it finds awaited is past its bound, sets itself again for that head's own bound if
    it is not yet, and ends if no head is awaited (the next one sets a fresh timer). A kept-alive
    connection answering request after request so sets a timer about once a bound, not once a
    request: a timer set and cancelled per request cost more of the gateway's time a call than
    any other part of this protocol (issue 46).
    """

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None
    _head_since: float | None = None  # when the head now awaited began (loop time); None: none awaited
    _head_of: object = None  # the cycle there was when it began: a new one means the headers are in

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_since is None:
            cycle = self.cycle  # type: ignore[attr-defined]
            if cycle is None or cycle.response_complete:
                self._await_head()  # the first bytes of the next request
        super().data_received(data)  # type: ignore[misc]
        self._note_head_in()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._note_head_in()  # h11 parses a pipelined request here

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _await_head(self) -> None:
        self._head_of = self.cycle  # type: ignore[attr-defined]
        self._head_since = now = self.loop.time()  # type: ignore[attr-defined]
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(now + self.header_timeout_s, self._head_due)  # type: ignore[attr-defined]

    def _note_head_in(self) -> None:
        if self._head_since is not None and self.cycle is not self._head_of:  # type: ignore[attr-defined]
            self._head_since = None  # the timer, when it fires, finds no head awaited

    def _head_due(self) -> None:
        self._head_timer = None
        if self._head_since is None:
            return
        due = self._head_since + self.header_timeout_s
        if self.loop.time() < due:  # type: ignore[attr-defined]
            self._head_timer = self.loop.call_at(due, self._head_due)  # type: ignore[attr-defined]
            return
        self._head_since = None
        transport = self.transport  # type: ignore[attr-defined]
        if not transport.is_closing():
            log.debug("closing %s: no request headers within %.3g s", self.client, self.header_timeout_s)  # type: ignore[attr-defined]
            transport.close()


def check_header_timeout(header_timeout_s: float | None) -> float | None:
    """``header_timeout_s`` as a float (None stays None: no bound); ValueError naming it unless it is
    a positive, finite number of seconds."""
    if header_timeout_s is None:
        return None
    if isinstance(header_timeout_s, bool) or not isinstance(header_timeout_s, int | float):
        raise ValueError(f"header_timeout_s: must be a number of seconds, got {header_timeout_s!r}")
    if not 0 < header_timeout_s < math.inf:
        raise ValueError(f"header_timeout_s: must be positive and finite, got {header_timeout_s!r}")
    return float(header_timeout_s)


def http_protocol(http: str | type = "auto", header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S) -> str | type:
    """uvicorn's ``http`` setting, its protocol closing a connection whose request headers have not
    all arrived within ``header_timeout_s`` seconds (None: ``http`` as it is, no bound).

    ``http`` is what uvicorn takes: ``"auto"`` (httptools where installed, else h11),
    ``"httptools"``, ``"h11"``, or one of their protocol classes. ValueError for a timeout that
    is not a positive number of seconds, or a protocol other than those two.
    """
    header_timeout_s = check_header_timeout(header_timeout_s)
    if header_timeout_s is None:
        return http
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string
    from uvicorn.protocols.http.h11_impl import H11Protocol

    base = http if isinstance(http, type) else import_from_string(HTTP_PROTOCOLS.get(http, http))
    bases: tuple[type, ...] = (H11Protocol,)
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        bases += (HttpToolsProtocol,)
    except ImportError:  # httptools not installed
        pass
    if not issubclass(base, bases):
        raise ValueError(f"http: the header timeout works with uvicorn's h11 or httptools protocol, not {http!r}")
    return type(f"HeaderTimeout{base.__name__}", (_HeaderDeadline, base), {"header_timeout_s": header_timeout_s})


__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "check_header_timeout", "http_protocol"]
