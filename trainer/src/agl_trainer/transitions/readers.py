"""Readers: how the builder gets a chunk of rollouts' records out of a store.

:class:`_SqlReader` uses a SQL store's bulk reads (only the columns the build
needs, see :meth:`agl.store.sql.SqlStore.transition_rows`) on any store that offers
them; :class:`_GenericReader` goes through the public :class:`~agl.store.Store`
queries and works on any store (HTTP included).
"""

from __future__ import annotations

import contextlib
import json
import sys
from array import array
from typing import Any

from agl.schema import Task
from agl.store.base import Store
from agl_trainer.transitions.messages import _json_attr, _opt_str
from agl_trainer.transitions.records import _Call, _Chunk, _LlmSpan, _Reward

_SWAP = sys.byteorder != "little"


class _GenericReader:
    """Reads through the public Store API (any backend; what a store without the bulk reads, HTTP, gets)."""

    def __init__(self, store: Store, need_text: bool):
        self.store = store
        self.need_text = need_text

    def fetch(self, rollout_ids: list[str]) -> _Chunk:
        return self.read(rollout_ids)

    def convert(self, chunk: _Chunk) -> _Chunk:
        return chunk

    def read(self, rollout_ids: list[str]) -> _Chunk:
        chunk = _Chunk({}, {}, {})
        for c in self.store.query_llm_calls(rollout_ids=rollout_ids):
            chunk.calls.setdefault(c.rollout_id, []).append(
                _Call(
                    c.call_id,
                    c.seq,
                    c.created_at,
                    c.model_version,
                    c.prompt_ids,
                    c.response_ids,
                    c.response_logprobs,
                    c.request,
                    c.response,
                )
            )
        for s in self.store.query_spans(rollout_ids=rollout_ids, kind="llm"):
            a = s.attributes
            chunk.spans.setdefault(s.rollout_id, []).append(
                _LlmSpan(
                    s.span_id,
                    s.seq,
                    s.end_time or s.start_time,
                    _opt_str(a.get("gen_ai.response.id")),
                    _opt_str(a.get("gen_ai.agent.name")),
                    _json_attr(a.get("gen_ai.input.messages")),
                    _json_attr(a.get("gen_ai.output.messages")),
                    True,
                )
            )
        for r in self.store.query_rewards(rollout_ids=rollout_ids):
            chunk.rewards.setdefault(r.rollout_id, []).append(r)
        return chunk

    def load_span(self, span: _LlmSpan) -> None:  # already loaded
        return None

    def load_calls(self, calls: list[_Call]) -> None:
        return None

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        out = {}
        for tid in task_ids:
            with contextlib.suppress(KeyError):
                out[tid] = self.store.get_task(tid)
        return out


class _SqlReader:
    """Reads a SQL store's bulk reads: only the needed columns, no record decoded whole.

    Works on any store with the methods in ``FAST_READS`` (:class:`~agl.store.sql.SqlStore`:
    SQLite and PostgreSQL): their rows are described at
    :meth:`~agl.store.sql.SqlStore.transition_rows`.
    """

    def __init__(self, store: Any):
        self.store = store

    def read(self, rollout_ids: list[str]) -> _Chunk:
        return self.convert(self.fetch(rollout_ids))

    def fetch(self, rollout_ids: list[str]) -> Any:
        """The store's rows of these rollouts (the database's part: the builder runs it on a helper thread)."""
        return self.store.transition_rows(rollout_ids)

    def convert(self, rows: Any) -> _Chunk:
        """The rows :meth:`fetch` returned, as records (the Python part: the builder runs it on its own thread)."""
        # Rows come grouped by rollout: a bucket is looked up once per rollout, not per row
        # (``setdefault`` keeps this right should a store give them in any other order).
        calls: dict[str, list[_Call]] = {}
        last, bucket = None, None
        for rid, cid, seq, t, mv, p, r, lp in rows.calls:
            if rid != last:
                bucket = calls.setdefault(rid, [])
                last = rid
            # One copy: the row's bytes straight into the array's buffer.
            pa = array("i")
            pa.frombytes(p)
            ra = array("i")
            ra.frombytes(r)
            if lp is None:
                bucket.append(_Call(cid, seq or 0, t or 0.0, mv, pa, ra, None))
            else:
                la = array("f")
                la.frombytes(lp)
                bucket.append(_Call(cid, seq or 0, t or 0.0, mv, pa, ra, la))
        if _SWAP:  # token blobs are little-endian; swap on a big-endian host
            for bucket in calls.values():
                for c in bucket:
                    for values in (c.prompt_ids, c.response_ids, c.logprobs):
                        if values is not None:
                            values.byteswap()
        spans: dict[str, list[_LlmSpan]] = {}
        last = None
        for rid, sid, seq, start, end, resp_id, agent in rows.spans:
            if rid != last:
                bucket = spans.setdefault(rid, [])
                last = rid
            # The store's text columns hold the attribute (a string as it is); anything else goes through _opt_str.
            if resp_id.__class__ is not str or not resp_id:
                resp_id = _opt_str(resp_id)
            if agent.__class__ is not str or not agent:
                agent = _opt_str(agent)
            bucket.append(_LlmSpan(sid, seq or 0, end or start, resp_id, agent))
        rewards: dict[str, list[Any]] = {}
        last = None
        for rid, wid, name, value, source, t in rows.rewards:
            if rid != last:
                bucket = rewards.setdefault(rid, [])
                last = rid
            bucket.append(_Reward(wid, name, float(value), source, t or 0.0))
        return _Chunk(calls, spans, rewards)

    def load_span(self, span: _LlmSpan) -> None:
        if span.loaded:
            return
        rows = self.store.span_messages([span.span_id])
        if rows:
            span.input_messages = _json_attr(rows[0][1])
            span.output_messages = _json_attr(rows[0][2])
        span.loaded = True

    def load_calls(self, calls: list[_Call]) -> None:
        todo = [c for c in calls if c.request is None]
        if not todo:
            return
        by_id = {c.call_id: c for c in todo}
        for cid, req, resp in self.store.call_payloads([c.call_id for c in todo]):
            by_id[cid].request = json.loads(req) if req else {}
            by_id[cid].response = json.loads(resp) if resp else {}

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        return self.store.get_tasks(task_ids)


FAST_READS = ("transition_rows", "span_messages", "call_payloads", "get_tasks")
"""The bulk reads a store offers for the fast path (duck-typed: no store class is named here)."""


def _reader_for(store: Store, need_text: bool) -> _GenericReader | _SqlReader:
    """The fast reader where ``store`` has every method in ``FAST_READS``, the generic one otherwise."""
    if all(callable(getattr(store, name, None)) for name in FAST_READS):
        return _SqlReader(store)
    return _GenericReader(store, need_text)
