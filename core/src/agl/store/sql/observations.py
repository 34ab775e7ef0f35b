"""Spans and LLM calls on a SQL store: their writes, their queries and the bulk reads of them that
building transitions makes.

A few fields of each record are copied into columns at write time (``FIELD_COLUMNS`` in
:mod:`agl.store.sql.dialect`), so the bulk reads take them without decoding the JSON body;
an LLM call's token ids and logprobs are columns of their own (little-endian bytes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from itertools import starmap
from typing import Any

from agl.schema import LLMCall, Span
from agl.store.bulk import CallColumns, CallPayload, SpanColumns, SpanMessages, attribute_text
from agl.store.packed import PackedSpan
from agl.store.sql.commit import GroupCommit
from agl.store.sql.dialect import FIELD_COLUMNS
from agl.store.sql.jobs import Insert
from agl.store.sql.rows import TOKEN_EXCLUDE, json_body
from agl.tokens import STORED, float32_array, int32_array, to_bytes

_SPAN_COLUMNS = ("span_id", "rollout_id", "kind", "start_time", "body", *FIELD_COLUMNS["spans"])
_CALL_COLUMNS = (
    "call_id",
    "rollout_id",
    "body",
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "behaviour_logprobs",
    *FIELD_COLUMNS["llm_calls"],
)


def span_row(s: Span) -> tuple[Any, ...]:
    """The ``spans`` row of a span, in the order of ``_SPAN_COLUMNS``."""
    a = s.attributes
    if a:
        resp, agent = a.get("gen_ai.response.id"), a.get("gen_ai.agent.name")
        if resp is not None and resp.__class__ is not str:
            resp = attribute_text(resp)
        if agent is not None and agent.__class__ is not str:
            agent = attribute_text(agent)
    else:
        resp = agent = None
    return (s.span_id, s.rollout_id, s.kind, s.start_time, json_body(s), s.seq, s.end_time, resp, agent)


class SpansAndCalls(GroupCommit):
    """Spans and LLM calls (a mixin of :class:`~agl.store.sql.SqlStore`)."""

    def _spans_op(self, spans: Iterable[Span | PackedSpan]) -> Callable[[Any], Any]:
        rows = [s.row if s.__class__ is PackedSpan else span_row(s) for s in spans]
        return Insert(self, "spans", _SPAN_COLUMNS, rows)

    def pack_span(self, span: Span) -> Span | PackedSpan:
        """``span`` as the row :meth:`add_spans` would insert for it (a :class:`PackedSpan`, which
        ``add_spans`` takes as it takes the span), or ``span`` itself where a subclass changed
        ``add_spans`` (and so may want the span)."""
        if type(self).add_spans is not SpansAndCalls.add_spans:
            return span
        row = span_row(span)
        return PackedSpan(span, row[4], row)

    def _llm_calls_op(self, calls: Iterable[LLMCall]) -> Callable[[Any], Any]:
        rows = []
        for c in calls:
            body = json_body(c, TOKEN_EXCLUDE)
            logprobs = None if c.response_logprobs is None else to_bytes(c.response_logprobs)
            behaviour = None if c.behaviour_logprobs is None else to_bytes(c.behaviour_logprobs)
            rows.append(
                (
                    c.call_id,
                    c.rollout_id,
                    body,
                    to_bytes(c.prompt_ids),
                    to_bytes(c.response_ids),
                    logprobs,
                    behaviour,
                    c.seq,
                    c.created_at,
                    c.model_version,
                    c.policy,
                )
            )
        return Insert(self, "llm_calls", _CALL_COLUMNS, rows)

    def add_spans(self, spans: Iterable[Span | PackedSpan]) -> None:
        self._write(self._spans_op(spans))

    def add_llm_calls(self, calls: Iterable[LLMCall]) -> None:
        self._write(self._llm_calls_op(calls))

    def _span_filter(self, rollout_id, rollout_ids, kind, production, since, until) -> tuple[list[str], list[Any]]:
        where, params = ["1 = 1"], []
        self._filter_rollout(where, params, rollout_id, rollout_ids, production)
        self._where_given(where, params, ("kind = ?", kind), ("start_time >= ?", since), ("start_time < ?", until))
        return where, params

    def query_spans(self, *, rollout_id=None, rollout_ids=None, kind=None, production=False, since=None, until=None):
        where, params = self._span_filter(rollout_id, rollout_ids, kind, production, since, until)
        for (body,) in self._paged("spans", "body", where, params):
            yield Span.model_validate_json(body, context=STORED)

    def query_llm_calls(self, *, rollout_id=None, rollout_ids=None, call_ids=None, production=False):
        where, params = ["1 = 1"], []
        self._filter_rollout(where, params, rollout_id, rollout_ids, production)
        if call_ids is not None:
            self._in("call_id", list(call_ids), where, params)
        for body, prompt, response, logprobs, behaviour in self._paged(
            "llm_calls", "body, prompt_ids, response_ids, response_logprobs, behaviour_logprobs", where, params
        ):
            data = json.loads(body)
            data["prompt_ids"] = int32_array(bytes(prompt))
            data["response_ids"] = int32_array(bytes(response))
            data["response_logprobs"] = None if logprobs is None else float32_array(bytes(logprobs))
            data["behaviour_logprobs"] = None if behaviour is None else float32_array(bytes(behaviour))
            yield LLMCall.model_validate(data, context=STORED)

    def count_spans(self, *, rollout_id=None, rollout_ids=None, kind=None, production=False, since=None, until=None):
        where, params = self._span_filter(rollout_id, rollout_ids, kind, production, since, until)
        return int(self._read(f"SELECT COUNT(*) FROM spans WHERE {' AND '.join(where)}", params)[0][0])

    # -- bulk reads for building transitions ----------------------------------------
    # One statement per table for up to 500 rollouts. Rows come grouped by rollout (``ORDER BY
    # rollout_id, pk``: the ``(rollout_id, pk)`` index gives that order, where ``ORDER BY pk``
    # alone made the database sort every row, token blobs included).
    def _call_rows(self, rollout_ids: Sequence[str]) -> CallColumns:
        rows = self._read_in(
            "SELECT rollout_id, call_id, seq, created_at, model_version, prompt_ids, response_ids, response_logprobs, "
            "behaviour_logprobs, policy FROM llm_calls WHERE",
            "rollout_id",
            rollout_ids,
            " ORDER BY rollout_id, pk",
        )
        return CallColumns.from_rows(rows)

    def _span_rows(self, rollout_ids: Sequence[str]) -> SpanColumns:
        rows = self._read_in(
            "SELECT rollout_id, span_id, seq, start_time, end_time, response_id, agent"
            " FROM spans WHERE kind = 'llm' AND",
            "rollout_id",
            rollout_ids,
            " ORDER BY rollout_id, pk",
        )
        return SpanColumns.from_rows(rows)

    def span_messages(self, span_ids: Sequence[str]) -> list[SpanMessages]:
        """Their ``gen_ai.input.messages`` and ``gen_ai.output.messages`` attributes as
        :meth:`~agl.store.sql.Dialect.json_field` gives them."""
        f = self.dialect.json_field
        rows = self._read_in(
            f"SELECT span_id, {f('body', ['attributes', 'gen_ai.input.messages'])}, "
            f"{f('body', ['attributes', 'gen_ai.output.messages'])} FROM spans WHERE",
            "span_id",
            span_ids,
        )
        return list(starmap(SpanMessages, rows))

    def call_payloads(self, call_ids: Sequence[str]) -> list[CallPayload]:
        f = self.dialect.json_field
        rows = self._read_in(
            f"SELECT call_id, {f('body', ['request'])}, {f('body', ['response'])} FROM llm_calls WHERE",
            "call_id",
            call_ids,
        )
        return list(starmap(CallPayload, rows))
