"""Readers: how the builder gets a chunk of rollouts' records out of a store.

:class:`_SqliteReader` reads the embedded SQLite store's tables directly (only the
columns the build needs); :class:`_GenericReader` goes through the public
:class:`~agl.store.Store` queries and works on any store.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from agl.schema import Task
from agl.store.base import Store
from agl.transitions.messages import _json_attr, _opt_str
from agl.transitions.records import _Call, _Chunk, _LlmSpan, _Reward

_SWAP = sys.byteorder != "little"


class _GenericReader:
    """Reads through the public Store API (any backend: HTTP, PostgreSQL, …)."""

    def __init__(self, store: Store, need_text: bool):
        self.store = store
        self.need_text = need_text

    def read(self, rollout_ids: list[str]) -> _Chunk:
        chunk = _Chunk({}, {}, {})
        for c in self.store.query_llm_calls(rollout_ids=rollout_ids):
            chunk.calls.setdefault(c.rollout_id, []).append(
                _Call(c.call_id, c.seq, c.created_at, c.model_version, c.prompt_ids, c.response_ids,
                      c.response_logprobs, c.request, c.response)
            )
        for s in self.store.query_spans(rollout_ids=rollout_ids, kind="llm"):
            a = s.attributes
            chunk.spans.setdefault(s.rollout_id, []).append(
                _LlmSpan(s.span_id, s.seq, s.end_time or s.start_time, _opt_str(a.get("gen_ai.response.id")),
                         _opt_str(a.get("gen_ai.agent.name")), _json_attr(a.get("gen_ai.input.messages")),
                         _json_attr(a.get("gen_ai.output.messages")), True)
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
            try:
                out[tid] = self.store.get_task(tid)
            except KeyError:
                pass
        return out


class _SqliteReader:
    """Reads the embedded SQLite store's tables directly: only the needed columns, no JSON in Python.

    Uses the SQL store's one-statement read helper (``_read``), which is part of
    the same package; every other store goes through :class:`_GenericReader`.
    """

    def __init__(self, store: Any):
        self.store = store

    def _q(self, sql: str, params: Sequence[Any]) -> list:
        return self.store._read(sql, params)

    @staticmethod
    def _marks(n: int) -> str:
        return ", ".join("?" for _ in range(n))

    def read(self, rollout_ids: list[str]) -> _Chunk:
        m = self._marks(len(rollout_ids))
        chunk = _Chunk({}, {}, {})
        rows = self._q(
            "SELECT rollout_id, call_id, json_extract(body, '$.seq'), json_extract(body, '$.created_at'), "
            "json_extract(body, '$.model_version'), prompt_ids, response_ids, response_logprobs "
            f"FROM llm_calls WHERE rollout_id IN ({m}) ORDER BY pk",
            rollout_ids,
        )
        calls = chunk.calls
        for rid, cid, seq, t, mv, p, r, lp in rows:
            pa = array("i")
            pa.frombytes(p)
            ra = array("i")
            ra.frombytes(r)
            if lp is None:
                la = None
            else:
                la = array("f")
                la.frombytes(lp)
            entry = _Call(cid, seq or 0, t or 0.0, mv, pa, ra, la)
            bucket = calls.get(rid)
            if bucket is None:
                calls[rid] = [entry]
            else:
                bucket.append(entry)
        if _SWAP:  # token blobs are little-endian; swap on a big-endian host
            for bucket in calls.values():
                for c in bucket:
                    for values in (c.prompt_ids, c.response_ids, c.logprobs):
                        if values is not None:
                            values.byteswap()
        rows = self._q(
            "SELECT rollout_id, span_id, json_extract(body, '$.seq'), start_time, json_extract(body, '$.end_time'), "
            "json_extract(body, '$.attributes.\"gen_ai.response.id\"'), "
            "json_extract(body, '$.attributes.\"gen_ai.agent.name\"') "
            f"FROM spans WHERE kind = 'llm' AND rollout_id IN ({m}) ORDER BY pk",
            rollout_ids,
        )
        for rid, sid, seq, start, end, resp_id, agent in rows:
            chunk.spans.setdefault(rid, []).append(
                _LlmSpan(sid, seq or 0, end or start, _opt_str(resp_id), _opt_str(agent))
            )
        rows = self._q(
            "SELECT rollout_id, reward_id, json_extract(body, '$.name'), json_extract(body, '$.value'), "
            "json_extract(body, '$.source'), json_extract(body, '$.created_at') "
            f"FROM rewards WHERE rollout_id IN ({m}) ORDER BY pk",
            rollout_ids,
        )
        for rid, wid, name, value, source, t in rows:
            chunk.rewards.setdefault(rid, []).append(_Reward(wid, name, float(value), source, t or 0.0))
        return chunk

    def load_span(self, span: _LlmSpan) -> None:
        if span.loaded:
            return
        rows = self._q(
            "SELECT json_extract(body, '$.attributes.\"gen_ai.input.messages\"'), "
            "json_extract(body, '$.attributes.\"gen_ai.output.messages\"') FROM spans WHERE span_id = ?",
            [span.span_id],
        )
        if rows:
            span.input_messages = _json_attr(rows[0][0])
            span.output_messages = _json_attr(rows[0][1])
        span.loaded = True

    def load_calls(self, calls: list[_Call]) -> None:
        todo = [c for c in calls if c.request is None]
        if not todo:
            return
        by_id = {c.call_id: c for c in todo}
        for i in range(0, len(todo), 500):
            ids = [c.call_id for c in todo[i : i + 500]]
            sql = f"SELECT call_id, json_extract(body, '$.request'), json_extract(body, '$.response') FROM llm_calls WHERE call_id IN ({self._marks(len(ids))})"
            for cid, req, resp in self._q(sql, ids):
                by_id[cid].request = json.loads(req) if req else {}
                by_id[cid].response = json.loads(resp) if resp else {}

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        out = {}
        for i in range(0, len(task_ids), 500):
            ids = task_ids[i : i + 500]
            for (body,) in self._q(f"SELECT body FROM tasks WHERE task_id IN ({self._marks(len(ids))})", ids):
                task = Task.model_validate_json(body)
                out[task.task_id] = task
        return out


def _reader_for(store: Store, need_text: bool) -> _GenericReader | _SqliteReader:
    dialect = getattr(store, "dialect", None)
    if getattr(dialect, "name", None) == "sqlite" and hasattr(store, "_read"):
        return _SqliteReader(store)
    return _GenericReader(store, need_text)
