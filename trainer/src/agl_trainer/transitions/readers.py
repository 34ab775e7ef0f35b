"""Readers: how the builder gets a chunk of rollouts' records out of a store.

:class:`SqlReader` uses the store's bulk reads (:meth:`agl.store.base.Store.transition_rows`
and its siblings: only the fields the build needs, typed columns of :mod:`agl.store.bulk`), which a
SQL store answers from its columns; :class:`GenericReader` goes through the public
:class:`~agl.store.Store` queries, every record whole (HTTP included). :func:`reader_for` picks one for a
store (what :class:`~agl_trainer.transitions.builder.TransitionBuilder` uses unless
it is given a reader); both follow :class:`Reader`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from array import array
from typing import Any, Protocol

from agl.schema import Task
from agl.store.base import Store
from agl.store.bulk import TransitionRows
from agl_trainer.transitions.messages import json_attribute, optional_str
from agl_trainer.transitions.records import CallRecord, Chunk, RewardRecord, SpanRecord

_SWAP = sys.byteorder != "little"


class Reader(Protocol):
    """What the builder asks of a reader. ``fetch`` then ``convert`` is ``read``, split in two so the
    builder can run the store's part of the next chunk on a helper thread while it builds this one.
    """

    store: Store
    """The store it reads (the builder checks it is the builder's own)."""

    def fetch(self, rollout_ids: list[str]) -> Any:
        """The store's part of reading these rollouts' records (run on the builder's helper thread)."""
        ...

    def convert(self, fetched: Any) -> Chunk:
        """What :meth:`fetch` returned, as records."""
        ...

    def read(self, rollout_ids: list[str]) -> Chunk:
        """The records of these rollouts: their calls, LLM spans and rewards."""
        ...

    def load_span(self, span: SpanRecord) -> None:
        """Fill in the span's messages, if not ``loaded`` yet."""
        ...

    def load_calls(self, calls: list[CallRecord]) -> None:
        """Fill in the request and response of the calls that lack them."""
        ...

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        """The tasks of these ids that the store has."""
        ...


class GenericReader:
    """Reads through the public Store API (any backend; what a store without the bulk reads, HTTP, gets).

    Every record comes whole, messages and payloads included: ``load_span`` and ``load_calls`` have nothing to do.
    """

    def __init__(self, store: Store):
        self.store = store

    def fetch(self, rollout_ids: list[str]) -> Chunk:
        """The records of these rollouts (all of the work is the store's)."""
        return self.read(rollout_ids)

    def convert(self, fetched: Chunk) -> Chunk:
        """:meth:`fetch`'s records, as they are."""
        return fetched

    def read(self, rollout_ids: list[str]) -> Chunk:
        """The calls, LLM spans and rewards of these rollouts, through the public queries."""
        chunk = Chunk({}, {}, {})
        for c in self.store.query_llm_calls(rollout_ids=rollout_ids):
            chunk.calls.setdefault(c.rollout_id, []).append(
                CallRecord(
                    c.call_id,
                    c.seq,
                    c.created_at,
                    c.model_version,
                    c.prompt_ids,
                    c.response_ids,
                    c.response_logprobs,
                    c.request,
                    c.response,
                    c.behaviour_logprobs,
                    c.policy,
                )
            )
        for s in self.store.query_spans(rollout_ids=rollout_ids, kind="llm"):
            a = s.attributes
            chunk.spans.setdefault(s.rollout_id, []).append(
                SpanRecord(
                    s.span_id,
                    s.seq,
                    s.end_time or s.start_time,
                    optional_str(a.get("gen_ai.response.id")),
                    optional_str(a.get("gen_ai.agent.name")),
                    json_attribute(a.get("gen_ai.input.messages")),
                    json_attribute(a.get("gen_ai.output.messages")),
                    True,
                )
            )
        for r in self.store.query_rewards(rollout_ids=rollout_ids):
            chunk.rewards.setdefault(r.rollout_id, []).append(r)
        return chunk

    def load_span(self, span: SpanRecord) -> None:
        """Nothing to do: :meth:`read` gave the span whole."""
        return None

    def load_calls(self, calls: list[CallRecord]) -> None:
        """Nothing to do: :meth:`read` gave the calls whole."""
        return None

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        """The tasks the store has of these ids, one ``get_task`` each."""
        out = {}
        for tid in task_ids:
            with contextlib.suppress(KeyError):
                out[tid] = self.store.get_task(tid)
        return out


class SqlReader:
    """Reads through the store's bulk reads (the methods in :data:`FAST_READS`): only the needed
    fields, no record decoded whole where the store has its own (a SQL store: SQLite, PostgreSQL).
    On any other store the :class:`~agl.store.base.Store` defaults answer them, only slower.
    """

    def __init__(self, store: Store):
        self.store = store

    def read(self, rollout_ids: list[str]) -> Chunk:
        """The calls, LLM spans and rewards of these rollouts (their messages and payloads not read yet)."""
        return self.convert(self.fetch(rollout_ids))

    def fetch(self, rollout_ids: list[str]) -> TransitionRows:
        """The store's rows of these rollouts (the database's part: the builder runs it on a helper thread)."""
        return self.store.transition_rows(rollout_ids)

    def convert(self, fetched: TransitionRows) -> Chunk:
        """The rows :meth:`fetch` returned, as records (the Python part: the builder runs it on its own thread)."""
        # Rows come grouped by rollout: a bucket is looked up once per rollout, not per row
        # (``setdefault`` keeps this right should a store give them in any other order).
        calls: dict[str, list[CallRecord]] = {}
        last, bucket = None, None
        c = fetched.calls
        for rid, cid, seq, t, mv, p, r, lp, blp, policy in zip(
            c.rollout_id,
            c.call_id,
            c.seq,
            c.created_at,
            c.model_version,
            c.prompt_ids,
            c.response_ids,
            c.response_logprobs,
            c.behaviour_logprobs,
            c.policy,
            strict=True,
        ):
            if rid != last:
                bucket = calls.setdefault(rid, [])
                last = rid
            # One copy: the row's bytes straight into the array's buffer.
            pa = array("i")
            pa.frombytes(p)
            ra = array("i")
            ra.frombytes(r)
            bucket.append(
                CallRecord(cid, seq or 0, t or 0.0, mv, pa, ra, _floats(lp), behaviour=_floats(blp), policy=policy)
            )
        if _SWAP:  # token blobs are little-endian; swap on a big-endian host
            for bucket in calls.values():
                for call in bucket:
                    for values in (call.prompt_ids, call.response_ids, call.logprobs, call.behaviour):
                        if values is not None:
                            values.byteswap()
        spans: dict[str, list[SpanRecord]] = {}
        last = None
        sp = fetched.spans
        for rid, sid, seq, start, end, resp_id, agent in zip(
            sp.rollout_id, sp.span_id, sp.seq, sp.start_time, sp.end_time, sp.response_id, sp.agent, strict=True
        ):
            if rid != last:
                bucket = spans.setdefault(rid, [])
                last = rid
            # The store's text columns hold the attribute (a string as it is); anything else goes through optional_str.
            if resp_id.__class__ is not str or not resp_id:
                resp_id = optional_str(resp_id)
            if agent.__class__ is not str or not agent:
                agent = optional_str(agent)
            bucket.append(SpanRecord(sid, seq or 0, end or start, resp_id, agent))
        rewards: dict[str, list[Any]] = {}
        last = None
        w = fetched.rewards
        for rid, wid, name, value, source, t in zip(
            w.rollout_id, w.reward_id, w.name, w.value, w.source, w.created_at, strict=True
        ):
            if rid != last:
                bucket = rewards.setdefault(rid, [])
                last = rid
            bucket.append(RewardRecord(wid, name, float(value), source, t or 0.0))
        return Chunk(calls, spans, rewards)

    def load_span(self, span: SpanRecord) -> None:
        """Read the span's input and output messages (one ``span_messages`` query), unless ``loaded``."""
        if span.loaded:
            return
        found = self.store.span_messages([span.span_id])
        if found:
            span.input_messages = json_attribute(found[0].input)
            span.output_messages = json_attribute(found[0].output)
        span.loaded = True

    def load_calls(self, calls: list[CallRecord]) -> None:
        """Read the request and response of the calls that lack them (one ``call_payloads`` query)."""
        todo = [c for c in calls if c.request is None]
        if not todo:
            return
        by_id = {c.call_id: c for c in todo}
        for payload in self.store.call_payloads([c.call_id for c in todo]):
            call = by_id[payload.call_id]
            call.request = json.loads(payload.request) if payload.request else {}
            call.response = json.loads(payload.response) if payload.response else {}

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        """The tasks the store has of these ids (one ``get_tasks`` query)."""
        return self.store.get_tasks(task_ids)


FAST_READS = ("transition_rows", "span_messages", "call_payloads", "get_tasks")
"""The :class:`~agl.store.base.Store` bulk reads :class:`SqlReader` reads through."""


def reader_for(store: Store) -> GenericReader | SqlReader:
    """The reader a builder uses on ``store`` unless told otherwise.

    :class:`SqlReader` where ``store`` has its own implementation of every method in
    :data:`FAST_READS` (SQLite, PostgreSQL), :class:`GenericReader` otherwise (HTTP, any
    other store: the interface's defaults of the bulk reads decode every record whole
    anyway, and the generic reader does that in fewer queries).
    """
    cls = type(store)
    if all(getattr(cls, name, None) not in (None, getattr(Store, name)) for name in FAST_READS):
        return SqlReader(store)
    return GenericReader(store)


def _floats(blob: bytes | None) -> array | None:
    """A float32 token column as an array (one copy), or None where the column is NULL."""
    if blob is None:
        return None
    values = array("f")
    values.frombytes(blob)
    return values
