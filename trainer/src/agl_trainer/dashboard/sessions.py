"""The dashboard's login sessions: :class:`Sessions`.

Each login makes a new session id (32 random bytes, URL-safe), which the browser keeps in the
dashboard's cookie; logout ends it at once, and it ends by itself ``ttl_s`` after the login.
The server keeps a SHA-256 digest of each live id, never the id itself, so the table tells
nothing that would open a page, and looking an id up compares digests. Sessions live in the
server's memory: a restart logs everyone out.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

SESSION_TTL_S = 12 * 3600.0
"""How long a session lasts after its login."""
MAX_SESSIONS = 1000
"""Live sessions kept at most; a login past it ends the oldest."""


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()


class Sessions:
    """Live sessions by the digest of their id, oldest first, each with the time it ends."""

    def __init__(
        self,
        ttl_s: float = SESSION_TTL_S,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if ttl_s <= 0 or max_sessions < 1:
            raise ValueError("ttl_s and max_sessions: must be positive")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._ends: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def start(self) -> str:
        """A new session's id, for the cookie."""
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._ends[_digest(session_id)] = self.clock() + self.ttl_s
            while len(self._ends) > self.max_sessions:
                self._ends.popitem(last=False)
        return session_id

    def live(self, session_id: str | None) -> bool:
        """Whether ``session_id`` is a session that has not ended."""
        if not session_id:
            return False
        key = _digest(session_id)
        with self._lock:
            ends = self._ends.get(key)
            if ends is None:
                return False
            if ends <= self.clock():
                del self._ends[key]
                return False
            return True

    def end(self, session_id: str | None) -> None:
        """End ``session_id`` (nothing happens for one that is not live)."""
        if session_id:
            with self._lock:
                self._ends.pop(_digest(session_id), None)

    def __len__(self) -> int:
        return len(self._ends)


__all__ = ["MAX_SESSIONS", "SESSION_TTL_S", "Sessions"]
