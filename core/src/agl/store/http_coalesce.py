"""The coalescing of :class:`~agl.store.http.HttpStore`'s writes: calls waiting at the same moment
travel in one ``/v1/batch`` request (see :mod:`agl.store.http`)."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Protocol

from agl.errors import StoreUnavailable


class BatchSender(Protocol):
    """What a :class:`Coalescer` sends through (:class:`~agl.store.http.HttpStore`)."""

    def _send_batch(self, batch: list[Op]) -> None:
        """Send ``batch`` as one ``/v1/batch`` request and settle every op's future; never raises."""


class Op:
    """One caller's part of a coalesced request."""

    __slots__ = ("future", "kind", "payload")

    def __init__(self, kind: str, payload: bytes):
        self.kind = kind
        self.payload = payload
        self.future: Future = Future()


class Coalescer:
    """Sends whatever calls are waiting as one ``/v1/batch`` request, at most ``senders`` at a time.

    A caller that finds a sending slot free sends its own calls itself, with whatever
    is queued ahead of and behind them, so a lone caller never waits on another
    thread. Calls that arrive while every slot is busy wait in the queue: a caller
    whose own calls have been answered passes its slot, queue and all, to a helper
    thread rather than keep sending for the others, and the helper sends until the
    queue is empty.
    """

    def __init__(self, store: BatchSender, senders: int, max_bytes: int, linger_s: float):
        self.store = store
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self.senders = senders
        self._pending: deque[Op] = deque()
        self._cond = threading.Condition()
        self._busy = 0  # slots in use: callers and helpers sending
        self._handed = 0  # slots passed on, not yet taken up by a helper
        self._closed = False
        self._helpers = [
            threading.Thread(target=self._help, name=f"agl-http-sender-{i}", daemon=True) for i in range(senders)
        ]
        for thread in self._helpers:
            thread.start()

    def submit(self, ops: list[Op]) -> list[Any]:
        with self._cond:
            if self._closed:
                raise StoreUnavailable("the HTTP store is closed")
            self._pending.extend(ops)
            lead = self._busy < self.senders
            if lead:
                self._busy += 1
        if lead:
            self._send(ops)
        return [op.future.result() for op in ops]

    def _send(self, mine: list[Op] | None) -> None:
        """Send batches from the queue on one slot: until ``mine`` are answered (a caller)
        or the queue is empty (a helper); then pass the slot on or give it back."""
        while True:
            batch = self._take()
            if batch:
                self.store._send_batch(batch)  # settles every op's future; never raises
            with self._cond:
                if not self._pending:
                    self._busy -= 1
                    if self._closed:
                        self._cond.notify_all()  # helpers waiting for the last sender to leave
                    return
                if mine is not None and all(op.future.done() for op in mine):
                    self._handed += 1
                    self._cond.notify()
                    return

    def _take(self) -> list[Op]:
        if self.linger_s:
            time.sleep(self.linger_s)
        with self._cond:
            batch: list[Op] = []
            size = 0
            while self._pending and (not batch or size + len(self._pending[0].payload) <= self.max_bytes):
                op = self._pending.popleft()
                size += len(op.payload)
                batch.append(op)
            return batch

    def _help(self) -> None:
        while True:
            with self._cond:
                while not self._handed:
                    if self._closed and not self._busy:
                        return
                    self._cond.wait()
                self._handed -= 1
            self._send(None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._helpers:
            thread.join(timeout=30)
