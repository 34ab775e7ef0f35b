"""Building transitions from a real SqliteStore: joins, fallbacks, rewards, filters.

Each test runs twice: through the SQL fast path (SQLite and PostgreSQL stores) and
through the generic path that any other store (HTTP) takes.
"""

from __future__ import annotations

import logging

import pytest

from agl.hookspecs import hookimpl
from agl.plugins import register, unregister
from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span, Task, now
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.transitions import (
    GenericReader,
    SqlReader,
    TransitionBuilder,
    TransitionConfig,
    build_transitions,
    normalize_messages,
    reader_for,
)
from tests.conftest import wait_until


@pytest.fixture(params=[SqlReader, GenericReader], ids=["sqlite-fast", "generic"])
def reader(request, sqlite_store):
    """The reader each test builds through: the SQL store's bulk reads, then the public queries."""
    return request.param(sqlite_store)


@pytest.fixture
def store(sqlite_store):
    return sqlite_store


def _rollout(store, rid="ro-1", task="t-1", status=RolloutStatus.SUCCEEDED, output=None, answer=None):
    store.add_tasks([Task(task_id=task, input={"q": "?", "answer": answer})])
    store.enqueue([Rollout(rollout_id=rid, task_id=task, model_version="v0")])
    store.claim("runner", limit=10)
    return store.finish(rid, status, output=output, error=None if status == RolloutStatus.SUCCEEDED else "boom")


def _call(rid, cid, seq, messages, t, n=3):
    return LLMCall(
        call_id=cid,
        rollout_id=rid,
        seq=seq,
        request={"model": "m", "messages": messages},
        response={"id": cid, "choices": [{"message": {"role": "assistant", "content": f"answer {cid}"}}]},
        prompt_ids=list(range(seq, seq + n)),
        response_ids=[7, 8],
        response_logprobs=[-0.5, -0.25],
        model_version="v1",
        created_at=t,
    )


def _span(rid, sid, seq, t, response_id=None, agent=None, messages=None):
    attrs = {}
    if response_id:
        attrs["gen_ai.response.id"] = response_id
    if agent:
        attrs["gen_ai.agent.name"] = agent
    if messages is not None:
        attrs["gen_ai.input.messages"] = messages
    attrs["gen_ai.output.messages"] = [{"role": "assistant", "parts": [{"type": "text", "content": f"out {sid}"}]}]
    return Span(
        span_id=sid, rollout_id=rid, seq=seq, name="chat", kind="llm", start_time=t - 0.1, end_time=t, attributes=attrs
    )


def _msgs(text):
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def _reward(rid, value, t, name="reward", source="agent"):
    return Reward(rollout_id=rid, value=value, name=name, source=source, created_at=t)


def test_join_by_response_id_keeps_agent_names_and_engine_tokens(store, reader):
    r = _rollout(store)
    store.add_llm_calls([_call("ro-1", "c1", 0, _msgs("a"), 10.0), _call("ro-1", "c2", 1, _msgs("b"), 11.0)])
    store.add_spans([_span("ro-1", "s1", 0, 10.0, "c1", "planner"), _span("ro-1", "s2", 1, 11.0, "c2", "coder")])
    store.add_rewards([_reward("ro-1", 1.0, 12.0)])
    ts, report = build_transitions(store, [r], reader=reader)
    assert [(t.call_id, t.agent, t.token_source) for t in ts] == [
        ("c1", "planner", "engine"),
        ("c2", "coder", "engine"),
    ]
    assert list(ts[0].prompt_ids) == [0, 1, 2] and list(ts[1].response_ids) == [7, 8]
    assert list(ts[0].response_logprobs) == [-0.5, -0.25]
    assert [t.reward for t in ts] == [1.0, 1.0]
    assert [t.weight for t in ts] == [0.5, 0.5]
    assert [t.step for t in ts] == [0, 1]
    assert all(t.task_id == "t-1" and t.model_version == "v1" for t in ts)
    assert report.joined_by_id == 2 and report.gateway_only == 0 and report.transitions == 2
    assert report.rollouts_without_spans == 0


def test_fallback_by_order_needs_matching_messages(store, reader):
    r = _rollout(store)
    store.add_llm_calls(
        [
            _call("ro-1", "c1", 0, _msgs("first"), 10.0),
            _call("ro-1", "c2", 1, _msgs("second"), 11.0),
            _call("ro-1", "c3", 2, _msgs("third"), 12.0),
        ]
    )
    # Span messages in OpenTelemetry's parts shape; the span for c2 is missing (not traced).
    otel = lambda text: [  # noqa: E731
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": text}]},
    ]
    store.add_spans(
        [
            _span("ro-1", "s1", 0, 10.0, agent="a", messages=otel("first")),
            _span("ro-1", "s3", 1, 12.0, agent="b", messages=otel("third")),
        ]
    )
    store.add_rewards([_reward("ro-1", 1.0, 13.0)])
    ts, report = build_transitions(store, [r], reader=reader)
    assert [(t.call_id, t.agent) for t in ts] == [("c1", "a"), ("c2", None), ("c3", "b")]
    assert report.joined_by_order == 2 and report.gateway_only == 1 and report.unmatched_spans == 0
    assert report.rollouts_without_spans == 0  # one call with no span, but spans joined the others


def test_unmatched_span_is_reported_not_guessed(store, reader, caplog):
    r = _rollout(store)
    store.add_llm_calls([_call("ro-1", "c1", 0, _msgs("what the gateway saw"), 10.0)])
    store.add_spans([_span("ro-1", "s1", 0, 10.0, agent="a", messages=_msgs("something else"))])
    store.add_rewards([_reward("ro-1", 1.0, 13.0)])
    with caplog.at_level(logging.WARNING, logger="agl_trainer.transitions"):
        ts, report = build_transitions(store, [r], reader=reader)
    assert report.unmatched_spans == 1 and report.unmatched == [("ro-1", "s1")]
    assert "could not be matched" in caplog.text and "ro-1/s1" in caplog.text
    # The gateway's record is still training data, but it was not given the span's agent.
    assert [(t.call_id, t.agent) for t in ts] == [("c1", None)]
    # spans came, none joined a call: counted as a rollout whose calls no span joined
    assert report.rollouts_without_spans == 1 and report.without_spans == ["ro-1"]


def test_a_second_span_of_a_joined_call_is_counted_not_trained(store, reader):
    """Two tracers of one call (an SDK's own span beside an instrumentation's): one transition."""
    r = _rollout(store)
    store.add_llm_calls([_call("ro-1", "c1", 0, _msgs("hi"), 10.0), _call("ro-1", "c2", 1, _msgs("again"), 11.0)])
    store.add_spans(
        [
            _span("ro-1", "s1", 0, 10.0, response_id="c1", agent="a", messages=_msgs("hi")),
            _span("ro-1", "s1-sdk", 1, 10.1, response_id="c1", agent="a", messages=_msgs("hi")),
            _span("ro-1", "s2", 2, 11.0, response_id="c2", agent="a", messages=_msgs("again")),
        ]
    )
    store.add_rewards([_reward("ro-1", 1.0, 13.0)])
    ts, report = build_transitions(store, [r], reader=reader)
    assert [(t.call_id, t.token_source) for t in ts] == [("c1", "engine"), ("c2", "engine")]
    assert report.joined_by_id == 2 and report.text_only == 0 and report.duplicate_spans == 1
    assert report.joins().endswith(", 1 second spans of a joined call left out")


def test_span_without_gateway_record_is_text_only(store, reader):
    r = _rollout(store)
    store.add_spans([_span("ro-1", "s1", 0, 10.0, response_id="chatcmpl-hosted", agent="a", messages=_msgs("hi"))])
    store.add_rewards([_reward("ro-1", 0.5, 13.0)])
    ts, report = build_transitions(store, [r], reader=reader)
    (t,) = ts
    assert t.token_source == "text" and len(t.prompt_ids) == 0 and t.response_logprobs is None
    assert t.prompt_messages == _msgs("hi") and t.response_text == "out s1"
    assert t.reward == 0.5 and t.agent == "a" and report.text_only == 1
    assert report.rollouts_without_spans == 0  # no gateway call: nothing to join
    ts, _ = build_transitions(store, [r], TransitionConfig(text_only=False), reader=reader)
    assert ts == []


def test_gateway_records_without_spans_become_transitions(store, reader):
    r = _rollout(store)
    store.add_llm_calls([_call("ro-1", f"c{i}", i, _msgs(str(i)), 10.0 + i) for i in range(3)])
    store.add_rewards([_reward("ro-1", 1.0, 20.0)])
    ts, report = build_transitions(store, [r], reader=reader)
    assert [t.call_id for t in ts] == ["c0", "c1", "c2"] and all(t.agent is None for t in ts)
    assert report.gateway_only == 3
    assert report.rollouts_without_spans == 1 and report.without_spans == ["ro-1"]
    assert report.joins() == (
        "0 calls joined to their span by id, 0 by order, 3 unjoined (no LLM span), 0 text-only spans (no gateway call)"
    )


def test_aborted_calls_are_left_out_and_counted(store, reader):
    r = _rollout(store)
    aborted = LLMCall(
        call_id="c1",
        rollout_id="ro-1",
        seq=1,
        request={"model": "m", "messages": _msgs("1")},
        response={"id": "c1", "aborted": True, "reason": "client_disconnected"},
        prompt_ids=[],
        response_ids=[],
        created_at=11.0,
        aborted=True,
    )
    store.add_llm_calls([_call("ro-1", "c0", 0, _msgs("0"), 10.0), aborted, _call("ro-1", "c2", 2, _msgs("2"), 12.0)])
    store.add_rewards([_reward("ro-1", 1.0, 20.0)])
    ts, report = build_transitions(store, [r], reader=reader)
    assert [t.call_id for t in ts] == ["c0", "c2"] and [t.step for t in ts] == [0, 1]
    assert report.aborted_calls == 1 and report.as_metrics()["aborted_calls"] == 1.0
    assert [c.aborted for c in store.query_llm_calls(rollout_id="ro-1")] == [False, True, False]


def test_reward_precedence_returned_then_plugin_then_emitted(store, reader):
    r = _rollout(store, output="42", answer="42")
    store.add_llm_calls([_call("ro-1", "c1", 0, _msgs("a"), 10.0)])
    store.add_rewards([_reward("ro-1", 0.1, 11.0), _reward("ro-1", 0.2, 12.0)])
    ts, _ = build_transitions(store, [r], reader=reader)
    assert ts[0].reward == 0.2  # the last emitted reward named "reward"

    class Exact:
        @staticmethod
        @hookimpl
        def agl_reward(rollout):
            return {"reward": float(rollout.output == rollout.task.input["answer"]), "length": 2.0}

    register(Exact, name="exact")
    try:
        ts, _ = build_transitions(store, [r], reader=reader)
        assert ts[0].reward == 1.0  # a plugin beats an emitted reward
        stored = {(w.source, w.name): w.value for w in store.query_rewards(rollout_id="ro-1")}
        assert stored[("exact", "reward")] == 1.0 and stored[("exact", "length")] == 2.0
        build_transitions(store, [r], reader=reader)  # built again: the plugin's rows are not stored twice
        assert sum(1 for w in store.query_rewards(rollout_id="ro-1") if w.source == "exact") == 2
        store.add_rewards([_reward("ro-1", -1.0, 13.0, source="return")])
        ts, _ = build_transitions(store, [r], reader=reader)
        assert ts[0].reward == -1.0  # the returned reward beats everything
    finally:
        unregister(name="exact")


def test_missing_and_failed_rewards(store, reader):
    ok = _rollout(store, "ro-ok", "t-1")
    bad = _rollout(store, "ro-bad", "t-2", status=RolloutStatus.FAILED)
    for rid in ("ro-ok", "ro-bad"):
        store.add_llm_calls([_call(rid, f"{rid}-c", 0, _msgs("a"), 10.0)])
    ts, report = build_transitions(store, [ok, bad], reader=reader)
    assert [(t.rollout_id, t.reward) for t in ts] == [("ro-bad", 0.0)]
    assert report.dropped_rollouts == {"no_reward": 1}
    ts, report = build_transitions(
        store, [ok, bad], TransitionConfig(missing_reward=0.0, failed_reward=None), reader=reader
    )
    assert [t.rollout_id for t in ts] == ["ro-ok"] and report.dropped_rollouts == {"failed": 1}


def test_agent_filter_and_normalization_over_kept_calls(store, reader):
    r = _rollout(store)
    agents = ["planner", "coder", "planner", "critic"]
    store.add_llm_calls([_call("ro-1", f"c{i}", i, _msgs(str(i)), 10.0 + i) for i in range(4)])
    store.add_spans([_span("ro-1", f"s{i}", i, 10.0 + i, f"c{i}", a) for i, a in enumerate(agents)])
    store.add_rewards([_reward("ro-1", 1.0, 20.0)])
    cfg = TransitionConfig(agents=["planner"], credit="discounted", credit_options={"gamma": 0.5})
    ts, report = build_transitions(store, [r], cfg, reader=reader)
    assert [t.call_id for t in ts] == ["c0", "c2"] and {t.agent for t in ts} == {"planner"}
    # credit is assigned over the whole rollout before the filter: positions 0 and 2 of 4.
    assert [t.reward for t in ts] == [0.125, 0.5] and [t.step for t in ts] == [0, 2]
    assert [t.weight for t in ts] == [0.5, 0.5] and report.filtered_out == 2
    ts, _ = build_transitions(store, [r], TransitionConfig(normalize="none"), reader=reader)
    assert [t.weight for t in ts] == [1.0] * 4


def test_emitted_rewards_are_placed_by_time(store, reader):
    r = _rollout(store)
    store.add_llm_calls([_call("ro-1", f"c{i}", i, _msgs(str(i)), 10.0 + i) for i in range(3)])
    # after call 0: +1 (a tool step succeeded); final reward 2 emitted at the end.
    store.add_rewards([_reward("ro-1", 1.0, 10.5, name="step"), _reward("ro-1", 2.0, 13.0)])
    ts, _ = build_transitions(store, [r], TransitionConfig(credit="emitted", normalize="none"), reader=reader)
    assert [t.reward for t in ts] == [3.0, 2.0, 2.0]


def test_records_of_an_earlier_attempt_are_left_out(store, reader):
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id="ro-r", task_id="t", max_attempts=2)])
    first = store.claim("runner")[0]
    store.add_llm_calls([_call("ro-r", "old", 0, _msgs("a"), first.started_at + 0.001)])
    store.finish("ro-r", RolloutStatus.FAILED, error="boom")
    wait_until(lambda: now() > first.started_at + 0.001, "the clock has moved past the old call")
    second = store.claim("runner")[0]
    assert second.attempt == 2
    store.add_llm_calls([_call("ro-r", "new", 1, _msgs("a"), second.started_at + 0.001)])
    store.add_rewards([_reward("ro-r", 1.0, second.started_at + 0.002)])
    done = store.finish("ro-r", RolloutStatus.SUCCEEDED)
    ts, report = build_transitions(store, [done], reader=reader)
    assert [t.call_id for t in ts] == ["new"] and report.stale_records == 1


def test_unended_and_cancelled_rollouts_are_counted_not_built(store, reader):
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id="q", task_id="t"), Rollout(rollout_id="c", task_id="t")])
    store.cancel(["c"])
    ts, report = build_transitions(store, list(store.query_rollouts()), reader=reader)
    assert ts == [] and report.dropped_rollouts == {"not_ended": 1, "cancelled": 1}


def test_with_text_fills_messages_of_engine_transitions(store, reader):
    r = _rollout(store)
    store.add_llm_calls([_call("ro-1", "c1", 0, _msgs("a"), 10.0)])
    store.add_rewards([_reward("ro-1", 1.0, 11.0)])
    (t,) = TransitionBuilder(store, TransitionConfig(with_text=True), reader).build([r])
    assert t.prompt_messages == _msgs("a") and t.response_text == "answer c1"


def test_the_default_reader_uses_the_bulk_reads_where_a_store_has_them(sqlite_store):
    assert type(reader_for(sqlite_store)) is SqlReader
    assert type(TransitionBuilder(sqlite_store).reader) is SqlReader
    http = HttpStore("http://127.0.0.1:9")  # a client only: nothing is sent
    try:
        assert type(reader_for(http)) is GenericReader
        assert type(TransitionBuilder(http).reader) is GenericReader
    finally:
        http.close()


def test_a_reader_of_another_store_is_refused(sqlite_store, tmp_path):
    other = SqliteStore(tmp_path / "other.db")
    try:
        with pytest.raises(ValueError, match="reader: SqlReader reads another store than the builder's"):
            TransitionBuilder(sqlite_store, reader=SqlReader(other))
    finally:
        other.close()


def test_unknown_credit_strategy_names_the_field():
    from agl.errors import ConfigError

    with pytest.raises(ConfigError, match="credit assignment: no plugin provides 'nope'"):
        TransitionBuilder.__new__(TransitionBuilder).__init__(object(), TransitionConfig(credit="nope"))


def test_normalize_messages_shapes():
    assert normalize_messages("hi") == [("user", "hi")]
    assert normalize_messages(
        [{"type": "human", "content": "x"}, {"role": "ai", "content": [{"type": "text", "text": "y"}]}]
    ) == [("user", "x"), ("assistant", "y")]


def test_responses_tool_turns_read_as_the_integrations_record_them():
    """Responses input items and the GenAI messages an integration records for them compare equal."""
    items = [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "lookup", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "rain"},
    ]
    recorded = [
        {"role": "user", "parts": [{"type": "text", "content": "weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": '{"city": "Paris"}'},
                {"type": "tool_call", "id": "c2", "name": "lookup", "arguments": '{"city": "Rome"}'},
            ],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c2", "response": "rain"}]},
    ]
    assert normalize_messages(items) == normalize_messages(recorded)
    assert [role for role, _ in normalize_messages(items)] == ["user", "assistant", "tool", "tool"]
