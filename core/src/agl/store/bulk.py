"""The bulk reads that building transitions makes (:meth:`agl.store.base.Store.transition_rows` and its
siblings): their typed results, and their default implementations (:class:`BulkReads`, which
:class:`~agl.store.base.Store` inherits) through the store's public queries.

A record holds only the fields the build reads, the token ids as little-endian int32 bytes and the
logprobs as float32 bytes, as a SQL store keeps them, so a backend that reads its columns directly
(:class:`~agl.store.sql.SqlStore`) decodes no record whole. The defaults here work on any store,
one record at a time (only slower).

The records come as columns (:class:`Columns`), not an object each: beside the commit before
this interface (plain tuples read by position), on the shared 2-core host at load average 11-13,
``bench_transitions``' fast path took 0.157 -> 0.155 CPU s (medians of 4 interleaved runs; wall
0.251 -> 0.237 s), and the build alone, CPU min of 8 repeats on one stored 1,000 x 6 calls,
121.6 -> 125.8 ms (median of 5 interleaved runs each); a dataclass per record had cost 9-12 %.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from agl.errors import NotFound
from agl.schema import Task
from agl.tokens import to_bytes

RESPONSE_ID = "gen_ai.response.id"
AGENT_NAME = "gen_ai.agent.name"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"


class Columns:
    """Records as one sequence per field: row ``i`` of the records is item ``i`` of every field.

    Columns rather than an object per record: a chunk of a build is thousands of records, and
    turning the database's rows into columns is one pass in C (:meth:`from_rows`).
    """

    __slots__ = ()

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> Any:
        """These columns of ``rows`` (tuples in field order)."""
        return cls(*(tuple(zip(*rows, strict=True)) or ((),) * len(cls.__slots__)))

    def __len__(self) -> int:
        return len(getattr(self, self.__slots__[0]))

    def rows(self) -> list[tuple]:
        """The records as tuples in field order."""
        return list(zip(*(getattr(self, name) for name in self.__slots__), strict=True))


@dataclass(frozen=True, slots=True)
class CallColumns(Columns):
    """LLM calls (gateway records), as building transitions reads them."""

    rollout_id: Sequence[str]
    call_id: Sequence[str]
    seq: Sequence[int | None]
    created_at: Sequence[float | None]
    model_version: Sequence[str | None]
    prompt_ids: Sequence[bytes]
    """Little-endian int32 token ids."""
    response_ids: Sequence[bytes]
    """Little-endian int32 token ids."""
    response_logprobs: Sequence[bytes | None]
    """Little-endian float32, or None."""
    behaviour_logprobs: Sequence[bytes | None]
    """Little-endian float32, or None."""
    policy: Sequence[str | None]


@dataclass(frozen=True, slots=True)
class SpanColumns(Columns):
    """LLM spans (kind ``llm``), without their messages."""

    rollout_id: Sequence[str]
    span_id: Sequence[str]
    seq: Sequence[int | None]
    start_time: Sequence[float]
    end_time: Sequence[float | None]
    response_id: Sequence[str | None]
    """The ``gen_ai.response.id`` attribute as :func:`attribute_text` gives it."""
    agent: Sequence[str | None]
    """The ``gen_ai.agent.name`` attribute as :func:`attribute_text` gives it."""


@dataclass(frozen=True, slots=True)
class RewardColumns(Columns):
    """Rewards."""

    rollout_id: Sequence[str]
    reward_id: Sequence[str]
    name: Sequence[str]
    value: Sequence[float]
    source: Sequence[str | None]
    created_at: Sequence[float | None]


class TransitionRows(NamedTuple):
    """The records of some rollouts that building transitions reads, each grouped by rollout,
    each rollout's records in the order they were stored."""

    calls: CallColumns
    spans: SpanColumns
    """LLM spans (kind ``llm``) only."""
    rewards: RewardColumns


@dataclass(slots=True)
class SpanMessages:
    """A span's ``gen_ai.input.messages`` and ``gen_ai.output.messages`` attributes: a string as it
    is, a structure as its JSON text, None where the span has none."""

    span_id: str
    input: Any
    output: Any


@dataclass(slots=True)
class CallPayload:
    """The JSON text of an LLM call's request and response bodies (None where there was none)."""

    call_id: str
    request: str | None
    response: str | None


def attribute_text(value: Any) -> str | None:
    """A span attribute as a text column holds it: a string as it is, None as None, a structure
    as its JSON text, anything else as ``str`` gives it."""
    if value is None or value.__class__ is str:
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), allow_nan=True)
    return str(value)


def _json_value(value: Any) -> Any:
    """A JSON value as SQLite's ``json_extract`` gives it: a structure as its JSON text, the rest as it is."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), allow_nan=True)
    return value


def _optional_bytes(values: Any) -> bytes | None:
    return None if values is None else to_bytes(values)


class BulkReads:
    """The bulk reads of :class:`~agl.store.base.Store`, by default through its queries (a mixin
    of the interface: ``self`` is the store)."""

    def transition_rows(self, rollout_ids: Sequence[str]) -> TransitionRows:
        """What building transitions reads of these rollouts: their LLM calls, LLM spans and rewards,
        without messages or payloads. The default reads them through the queries, every record whole."""
        ids = list(rollout_ids)
        calls = [
            (
                c.rollout_id,
                c.call_id,
                c.seq,
                c.created_at,
                c.model_version,
                to_bytes(c.prompt_ids),
                to_bytes(c.response_ids),
                _optional_bytes(c.response_logprobs),
                _optional_bytes(c.behaviour_logprobs),
                c.policy,
            )
            for c in self.query_llm_calls(rollout_ids=ids)
        ]
        spans = [
            (
                s.rollout_id,
                s.span_id,
                s.seq,
                s.start_time,
                s.end_time,
                attribute_text(s.attributes.get(RESPONSE_ID)),
                attribute_text(s.attributes.get(AGENT_NAME)),
            )
            for s in self.query_spans(rollout_ids=ids, kind="llm")
        ]
        rewards = [
            (r.rollout_id, r.reward_id, r.name, r.value, r.source, r.created_at)
            for r in self.query_rewards(rollout_ids=ids)
        ]
        return TransitionRows(
            CallColumns.from_rows(calls), SpanColumns.from_rows(spans), RewardColumns.from_rows(rewards)
        )

    def span_messages(self, span_ids: Sequence[str]) -> list[SpanMessages]:
        """The messages of these LLM spans (ids the store lacks are left out). The default reads the
        store's LLM spans until it has found them all (the queries have no span-id filter)."""
        wanted = set(span_ids)
        found: list[SpanMessages] = []
        if not wanted:
            return found
        for s in self.query_spans(kind="llm"):
            if s.span_id in wanted:
                a = s.attributes
                found.append(
                    SpanMessages(s.span_id, _json_value(a.get(INPUT_MESSAGES)), _json_value(a.get(OUTPUT_MESSAGES)))
                )
                wanted.discard(s.span_id)
                if not wanted:
                    break
        return found

    def call_payloads(self, call_ids: Sequence[str]) -> list[CallPayload]:
        """The request and response bodies of these LLM calls (ids the store lacks are left out)."""

        def text(body: dict[str, Any] | None) -> str | None:
            return None if body is None else json.dumps(body, separators=(",", ":"), allow_nan=True)

        calls = self.query_llm_calls(call_ids=call_ids)
        return [CallPayload(c.call_id, text(c.request), text(c.response)) for c in calls]

    def get_tasks(self, task_ids: Sequence[str]) -> dict[str, Task]:
        """These tasks by id; ids not in the store are left out. The default: one ``get_task`` each."""
        out: dict[str, Task] = {}
        for task_id in task_ids:
            try:
                out[task_id] = self.get_task(task_id)
            except NotFound:
                continue
        return out
