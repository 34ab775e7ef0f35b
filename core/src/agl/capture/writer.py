"""A buffered writer that never makes the agent's thread wait on I/O.

Observations (spans, rewards, LLM call records) are appended to an in-memory
buffer; a background thread writes them to the store in batches when the buffer
holds ``batch_size`` items, every ``interval_s`` seconds, when a rollout ends
(:meth:`BufferedWriter.flush`) and at interpreter exit. A failed write is retried
with backoff; the items stay buffered until the store acknowledges them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from typing import Union

from agl.schema import LLMCall, Reward, Span
from agl.store.base import Store

log = logging.getLogger(__name__)

Item = Union[Span, Reward, LLMCall]

_live_writers: "weakref.WeakSet[BufferedWriter]" = weakref.WeakSet()


class BufferedWriter:
    """Batches observations into a :class:`~agl.store.Store` from a background thread."""

    def __init__(
        self,
        store: Store,
        *,
        batch_size: int = 512,
        interval_s: float = 0.2,
        max_buffered: int = 200_000,
    ):
        self.store = store
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.max_buffered = max_buffered
        self.written = 0
        self.write_errors = 0
        self._buffer: deque[Item] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # held by whoever is writing a batch
        self._space = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="agl-writer", daemon=True)
        self._thread.start()
        _live_writers.add(self)

    def put(self, item: Item) -> None:
        """Buffer one observation. Returns at once unless ``max_buffered`` items wait."""
        if self._closed:
            raise RuntimeError("the writer is closed")
        if len(self._buffer) >= self.max_buffered:
            self._wait_for_space()
        self._buffer.append(item)
        if len(self._buffer) >= self.batch_size:
            self._wake.set()

    def _wait_for_space(self) -> None:
        log.warning("agl writer: %d observations buffered, waiting for the store", len(self._buffer))
        self._wake.set()
        with self._space:
            self._space.wait_for(lambda: len(self._buffer) < self.max_buffered or self._closed, timeout=60)

    def flush(self) -> None:
        """Write everything buffered so far and return once the store has it."""
        self._drain()

    def pending(self) -> int:
        """How many observations wait to be written."""
        return len(self._buffer)

    def close(self) -> None:
        """Flush and stop the background thread."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join()
        self._drain()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                self._drain()
            except Exception:  # logged inside; the items stay buffered for the next round
                pass

    def _drain(self) -> None:
        with self._lock:
            delay = 0.05
            while self._buffer:
                batch: list[Item] = []
                while self._buffer and len(batch) < self.batch_size:
                    batch.append(self._buffer.popleft())
                try:
                    self._write(batch)
                except Exception as exc:
                    self.write_errors += 1
                    self._buffer.extendleft(reversed(batch))
                    log.warning("agl writer: store write failed (%s); retrying in %.2fs", exc, delay)
                    if self._closed and self.write_errors > 20:
                        log.error("agl writer: giving up with %d observations unwritten", len(self._buffer))
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                self.written += len(batch)
                with self._space:
                    self._space.notify_all()

    def _write(self, batch: list[Item]) -> None:
        spans = [i for i in batch if isinstance(i, Span)]
        calls = [i for i in batch if isinstance(i, LLMCall)]
        rewards = [i for i in batch if isinstance(i, Reward)]
        # LLM calls and spans before rewards: a reward plugin reading the store sees them first.
        if calls:
            self.store.add_llm_calls(calls)
        if spans:
            self.store.add_spans(spans)
        if rewards:
            self.store.add_rewards(rewards)


@atexit.register
def _flush_all_at_exit() -> None:
    for writer in list(_live_writers):
        try:
            writer.close()
        except Exception as exc:
            log.error("agl writer: could not flush at exit: %s", exc)
