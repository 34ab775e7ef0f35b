"""A buffered writer that never makes the agent's thread wait on I/O.

Observations (spans, rewards, LLM call records) are appended to an in-memory
buffer; a background thread writes them to the store in batches when the buffer
holds ``batch_size`` items, every ``interval_s`` seconds, when a rollout ends
(:meth:`BufferedWriter.flush`) and at interpreter exit.

Nothing accepted is dropped quietly:

- a write that fails transiently (the store is locked, down or unreachable) puts
  the batch back and is retried with backoff, for as long as the process lives;
- a batch the store refuses as bad input (``ValueError``/``TypeError``) is written
  item by item, so one bad item cannot hold back the rest; items refused on their
  own are kept in :attr:`BufferedWriter.rejected` and logged as errors;
- at interpreter exit every writer is flushed (for up to ``exit_timeout_s``); what
  still cannot be written is logged as an error with its count.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque

from agl.errors import StoreUnavailable
from agl.schema import LLMCall, Reward, Span
from agl.store.base import Store

log = logging.getLogger(__name__)

Item = Span | Reward | LLMCall

_MAX_BACKOFF_S = 5.0


def _is_bad_input(exc: BaseException) -> bool:
    """Whether the store refused the data itself, so retrying the same batch cannot help."""
    return isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, StoreUnavailable)


def _item_id(item: Item) -> str:
    if isinstance(item, Span):
        return f"span {item.span_id}"
    if isinstance(item, Reward):
        return f"reward {item.reward_id}"
    return f"llm call {item.call_id}"


class BufferedWriter:
    """Batches observations into a :class:`~agl.store.Store` from a background thread.

    ``put`` only appends to memory; it waits only when ``max_buffered`` items are
    already waiting for a store that cannot keep up (back-pressure instead of
    unbounded memory).
    """

    def __init__(
        self,
        store: Store,
        *,
        batch_size: int = 512,
        interval_s: float = 0.2,
        max_buffered: int = 200_000,
        exit_timeout_s: float = 30.0,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size: must be at least 1, got {batch_size}")
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be positive, got {interval_s}")
        if max_buffered < batch_size:
            raise ValueError(f"max_buffered: must be at least batch_size ({batch_size}), got {max_buffered}")
        self.store = store
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.max_buffered = max_buffered
        self.exit_timeout_s = exit_timeout_s
        self.written = 0
        """Items the store has acknowledged."""
        self.write_errors = 0
        """Failed write attempts so far (each retried or isolated)."""
        self.last_error: BaseException | None = None
        self.rejected: list[tuple[Item, BaseException]] = []
        """Items the store refused as bad input, with the reason."""
        self._buffer: deque[Item] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # held by whoever is writing a batch
        self._space = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="agl-writer", daemon=True)
        self._thread.start()
        # Registered per writer, after its store was opened: atexit runs handlers last
        # registered first, so this flush runs before any exit handler of the store.
        self._at_exit = _ExitFlush(self)
        atexit.register(self._at_exit)

    def put(self, item: Item) -> None:
        """Buffer one observation and return at once (unless ``max_buffered`` items wait)."""
        if self._closed:
            raise RuntimeError(f"the writer is closed; {_item_id(item)} was not accepted")
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

    def flush(self, timeout_s: float | None = None) -> None:
        """Write everything buffered so far; return once the store has it.

        While the store fails transiently this keeps retrying; with ``timeout_s`` it
        gives up after that long with :class:`~agl.errors.StoreUnavailable` (the
        items stay buffered and are retried later).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.05
        while not self._drain():
            if deadline is not None and time.monotonic() + delay > deadline:
                raise StoreUnavailable(
                    f"agl writer: {self.pending()} observations still buffered after {timeout_s}s; "
                    f"last error: {self.last_error}"
                )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def pending(self) -> int:
        """How many observations wait to be written."""
        return len(self._buffer)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (for up to ``timeout_s``) and stop the background thread."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._wake.set()
        self._thread.join()
        with self._space:
            self._space.notify_all()
        self.flush(timeout_s)

    def _run(self) -> None:
        delay = self.interval_s
        while not self._closed:
            self._wake.wait(delay)
            self._wake.clear()
            if self._closed:
                return  # close() flushes in the caller's thread
            try:
                ok = self._drain()
            except Exception:  # never let the thread die: the items stay buffered
                log.exception("agl writer: unexpected error while writing")
                ok = False
            delay = self.interval_s if ok else min(max(delay * 2, 0.05), _MAX_BACKOFF_S)

    def _drain(self) -> bool:
        """Write batches until the buffer is empty. False if the store failed transiently."""
        with self._lock:
            while self._buffer:
                batch: list[Item] = []
                while self._buffer and len(batch) < self.batch_size:
                    batch.append(self._buffer.popleft())
                if not self._write_or_requeue(batch):
                    return False
            return True

    def _write_or_requeue(self, batch: list[Item]) -> bool:
        try:
            self._write(batch)
        except Exception as exc:
            self.write_errors += 1
            self.last_error = exc
            if _is_bad_input(exc):
                return self._write_one_by_one(batch)
            self._buffer.extendleft(reversed(batch))
            log.warning("agl writer: store write failed (%s); %d observations kept for a retry", exc, len(self._buffer))
            return False
        self._acknowledged(len(batch))
        return True

    def _write_one_by_one(self, batch: list[Item]) -> bool:
        for i, item in enumerate(batch):
            try:
                self._write([item])
            except Exception as exc:
                self.write_errors += 1
                self.last_error = exc
                if _is_bad_input(exc):
                    self.rejected.append((item, exc))
                    log.error("agl writer: the store refused %s: %s", _item_id(item), exc)
                    continue
                self._buffer.extendleft(reversed(batch[i:]))
                return False
            self._acknowledged(1)
        return True

    def _acknowledged(self, n: int) -> None:
        self.written += n
        with self._space:
            self._space.notify_all()

    def _write(self, batch: list[Item]) -> None:
        spans = [i for i in batch if isinstance(i, Span)]
        calls = [i for i in batch if isinstance(i, LLMCall)]
        rewards = [i for i in batch if isinstance(i, Reward)]
        # LLM calls and spans before rewards: a reward plugin reading the store sees them first.
        # Every write is idempotent by id, so a batch retried after a partial write stores nothing twice.
        if calls:
            self.store.add_llm_calls(calls)
        if spans:
            self.store.add_spans(spans)
        if rewards:
            self.store.add_rewards(rewards)


class _ExitFlush:
    """Flushes one writer at interpreter exit without keeping it alive until then."""

    def __init__(self, writer: BufferedWriter):
        self._writer = weakref.ref(writer)

    def __call__(self) -> None:
        writer = self._writer()
        if writer is None:
            return
        try:
            writer.close(timeout_s=writer.exit_timeout_s)
        except Exception as exc:
            log.error("agl writer: %d observations could not be written at exit: %s", writer.pending(), exc)
