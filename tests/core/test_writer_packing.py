"""Spans waiting behind a full batch (or behind ``pack_after`` items) are held packed as their store's
rows, and store the same bytes.

Real SQLite stores. To hold the writer behind for certain, :class:`HeldStore` (a real
``SqliteStore``) keeps the writer thread inside its first commit until the test lets it go:
every span put meanwhile waits behind a full batch, as it does when the writer thread waits
for a CPU on a loaded host.
"""

from __future__ import annotations

import math
import threading

import pytest

from agl.capture import BufferedWriter
from agl.capture.writer import DROPPED_SPAN
from agl.schema import Span
from agl.store.packed import PackedSpan
from agl.store.sqlite import SqliteStore

BATCH = 4


class HeldStore(SqliteStore):
    """A SQLite store whose first commit returns only once ``release`` is set."""

    def __init__(self, *args, **kwargs):
        self.entered = threading.Event()
        self.release = threading.Event()
        super().__init__(*args, **kwargs)

    def _committed(self, jobs: int) -> None:
        super()._committed(jobs)
        if not self.entered.is_set() and self._commits > 1:  # not the schema's commit
            self.entered.set()
            assert self.release.wait(30), "the test never released the writer"


def _spans(n: int) -> list[Span]:
    """Spans with every kind of value a row is made from: the columns copied from attributes
    (a string, a structure, absent), unicode, floats, nesting, no rollout."""
    spans = []
    for i in range(n):
        attributes = {
            "gen_ai.input.messages": [{"role": "user", "content": f'Größe {i} — 東京 \u2028 "quoted" \\'}],
            "gen_ai.output.messages": [{"role": "assistant", "content": str(i), "finish_reason": "stop"}],
            "gen_ai.usage.input_tokens": i,
            "score": i / 7,
            "nested": {"a": [1, 2.5, None, True, {"b": "c"}]},
        }
        if i % 3 == 0:
            attributes["gen_ai.response.id"] = f"resp-{i}"
            attributes["gen_ai.agent.name"] = "planner"
        elif i % 3 == 1:
            attributes["gen_ai.response.id"] = {"id": i, "parts": ["x", "y"]}
            attributes["gen_ai.agent.name"] = 7
        spans.append(
            Span(
                span_id=f"span-{i:03d}",
                trace_id="trace",
                parent_id=None if i == 0 else "span-000",
                rollout_id=None if i % 5 == 4 else "ro",
                seq=i,
                name="GenericFakeChatModel" if i % 2 else "tool ✓",
                kind="llm" if i % 2 else "tool",
                start_time=1795966372.8130074 + i,
                end_time=1795966372.8138587 + i,
                status="ok",
                attributes=attributes if i != 2 else {},
            )
        )
    return spans


def _rows(store: SqliteStore) -> list[tuple]:
    return store.select("SELECT *, typeof(body), typeof(start_time), typeof(end_time) FROM spans ORDER BY pk")


def test_spans_held_packed_store_the_same_rows_as_spans_written_at_once(tmp_path):
    spans = _spans(40)
    direct = SqliteStore(tmp_path / "direct.db")
    direct.add_spans(spans)
    held = HeldStore(tmp_path / "held.db")
    w = BufferedWriter(held, batch_size=BATCH, interval_s=60)
    try:
        for span in spans[:BATCH]:
            w.put(span)
        assert held.entered.wait(10)  # the writer thread holds the first batch, inside its commit
        for span in spans[BATCH:]:
            w.put(span)
        waiting = list(w._buffer)
        packed = [x for x in waiting if isinstance(x, PackedSpan)]
        # a full batch waits unpacked; every span put behind it was packed
        assert len(waiting) == len(spans) - BATCH and len(packed) == len(waiting) - BATCH
        assert w.pending() == len(spans)
        held.release.set()
        w.flush(timeout_s=10)
        assert w.written == len(spans) and w.dropped == {}
        assert _rows(held) == _rows(direct)
        assert list(held.query_spans()) == list(direct.query_spans())
        assert [s for s in held.query_spans() if s.rollout_id is None] == [s for s in spans if s.rollout_id is None]
    finally:
        held.release.set()
        w.close()
        held.close()
        direct.close()


def test_a_writer_packing_every_span_stores_the_same_rows(tmp_path):
    """``pack_after=0`` (the production writer's): every span is packed as it is put."""
    spans = _spans(40)
    direct = SqliteStore(tmp_path / "direct.db")
    direct.add_spans(spans)
    store = SqliteStore(tmp_path / "packed.db")
    w = BufferedWriter(store, batch_size=1000, interval_s=60, pack_after=0)
    try:
        for span in spans:
            w.put(span)
        assert all(isinstance(x, PackedSpan) for x in w._buffer) and len(w._buffer) == len(spans)
        w.flush(timeout_s=10)
        assert w.written == len(spans) and _rows(store) == _rows(direct)
    finally:
        w.close()
        store.close()
        direct.close()


def test_pack_after_is_checked(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    try:
        for bad in (-1, 11):
            with pytest.raises(ValueError, match="pack_after: must be between 0 and batch_size"):
                BufferedWriter(store, batch_size=10, pack_after=bad)
    finally:
        store.close()


def test_a_packed_span_the_store_refuses_is_dropped_and_reported_as_a_span(tmp_path):
    held = HeldStore(tmp_path / "held.db")
    w = BufferedWriter(held, batch_size=BATCH, interval_s=60)
    good = _spans(2 * BATCH)
    fields = Span(span_id="bad-nan", rollout_id="ro", name="step", seq=99).model_dump()
    bad = Span.model_construct(**{**fields, "start_time": math.nan})  # as a client that skips validation sends it
    try:
        for span in good[:BATCH]:
            w.put(span)
        assert held.entered.wait(10)
        for span in [*good[BATCH:], bad]:
            w.put(span)
        assert isinstance(w._buffer[-1], PackedSpan)
        held.release.set()
        w.flush(timeout_s=10)
        assert w.dropped == {"span": 1} and w.written == len(good) + 1  # and the rollout's record of the loss
        [(item, error)] = w.rejected
        assert isinstance(item, Span) and item.span_id == "bad-nan" and math.isnan(item.start_time)
        assert "start_time" in str(error)
        stored = {s.span_id: s for s in held.query_spans()}
        assert "bad-nan" not in stored and all(s.span_id in stored for s in good)
        [record] = [s for s in stored.values() if s.name == DROPPED_SPAN]
        assert record.rollout_id == "ro" and record.attributes["agl.dropped.span"] == 1
    finally:
        held.release.set()
        w.close()
        held.close()


def test_a_packed_span_reads_back_as_the_span_and_a_store_that_changed_add_spans_gets_spans(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")

    class OwnWrites(SqliteStore):
        def add_spans(self, spans):
            super().add_spans(list(spans))

    own = OwnWrites(tmp_path / "own.db")
    try:
        for span in _spans(6):
            packed = store.pack_span(span)
            assert isinstance(packed, PackedSpan) and packed.span() == span
            assert (packed.span_id, packed.rollout_id, packed.name) == (span.span_id, span.rollout_id, span.name)
            assert own.pack_span(span) is span
    finally:
        store.close()
        own.close()
