"""Expiry without a trainer: a long-lived process holding the store takes back rollouts
whose runner went silent.

With external runners and no trainer loop (a production capture deployment), nothing
else calls :meth:`agl.store.Store.expire`, and a dead runner's rollouts would stay
``running`` forever. The store server runs an :class:`Expirer`: every ``interval_s`` it
calls ``expire(heartbeat_timeout_s=...)``, so a rollout whose last heartbeat is older
than the lease (or that ran past its own ``timeout_s``) ends its attempt ``timed_out``,
and the store's retry policy queues it again or fails it.

It is safe beside a trainer that expires too: ``expire`` is one write transaction, so
two callers never take back the same attempt twice, and a runner's late finish of an
expired attempt is refused (409), not recorded. The first pass waits one lease after
the start: runners could not heartbeat while the server was down, and they get that
long to be heard again before anything is taken from them.
"""

from __future__ import annotations

import logging
import threading
import time

from agl.store.base import Store

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
"""The lease, as in the trainer's ``rollout.heartbeat_timeout_s``."""


class Expirer:
    """Calls ``store.expire`` every ``interval_s`` seconds in a daemon thread, after a first
    wait of ``first_after_s`` (default: one lease, ``heartbeat_timeout_s``)."""

    def __init__(
        self,
        store: Store,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        first_after_s: float | None = None,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be positive, got {interval_s}")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s: must be positive, got {heartbeat_timeout_s}")
        if first_after_s is not None and first_after_s < 0:
            raise ValueError(f"first_after_s: must be at least 0, got {first_after_s}")
        self.store = store
        self.interval_s = interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.first_after_s = heartbeat_timeout_s if first_after_s is None else first_after_s
        self.expired = 0
        """Rollout attempts taken back so far."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> Expirer:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agl-store-expiry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; a pass in progress is waited for (up to 10 s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run_once(self) -> int:
        """One pass: take back what is due; how many attempts it ended."""
        taken = self.store.expire(heartbeat_timeout_s=self.heartbeat_timeout_s)
        if taken:
            self.expired += len(taken)
            shown = ", ".join(r.rollout_id for r in taken[:10]) + (", ..." if len(taken) > 10 else "")
            log.warning(
                "store expiry: took back %d rollout attempt(s) whose runner was silent for over %gs "
                "or that ran past their timeout: %s",
                len(taken),
                self.heartbeat_timeout_s,
                shown,
            )
        return len(taken)

    def _run(self) -> None:
        wait = self.first_after_s
        started = time.monotonic()
        while not self._stop.wait(wait):
            try:
                self.run_once()
            except Exception as exc:  # the database is busy or away: the next pass tries again
                if not self._failing:
                    log.warning("store expiry: a pass failed (%s: %s); will try again", type(exc).__name__, exc)
                self._failing = True
            else:
                if self._failing:
                    log.warning("store expiry: passes work again")
                self._failing = False
            wait = self.interval_s
        log.debug("store expiry: stopped after %.0fs", time.monotonic() - started)
