"""``merge="prefix"``: a rollout's calls whose token ids extend each other become one training row.

Built from a real SqliteStore, through the SQL fast path and the generic path; one test per
break reason, and the merged row's layout (segments, aligned log-probs, per-call rewards).
"""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Segment, Span, Task, Transition
from agl_trainer.transitions import GenericReader, SqlReader, TransitionConfig, build_transitions
from agl_trainer.transitions.merge import BREAK_REASONS

SYSTEM = [1, 9690, 198, 2]
"""The prompt every conversation starts with."""


@pytest.fixture(params=[SqlReader, GenericReader], ids=["sqlite-fast", "generic"])
def reader(request, sqlite_store):
    return request.param(sqlite_store)


def _rollout(store, rid="ro-1"):
    store.add_tasks([Task(task_id="t-1", input={"q": "?"})])
    store.enqueue([Rollout(rollout_id=rid, task_id="t-1", model_version="v0")])
    store.claim("runner", limit=10)
    return store.finish(rid, RolloutStatus.SUCCEEDED)


def _call(cid, seq, prompt, response, version="v1"):
    return LLMCall(
        call_id=cid,
        rollout_id="ro-1",
        seq=seq,
        request={"model": "m", "messages": [{"role": "user", "content": cid}]},
        response={"id": cid, "choices": [{"message": {"role": "assistant", "content": cid}}]},
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[-0.1 * (seq + 1)] * len(response),
        behaviour_logprobs=[-0.2 * (seq + 1)] * len(response),
        model_version=version,
        created_at=10.0 + seq,
    )


def _span(cid, seq, agent):
    t = 10.0 + seq
    attrs = {"gen_ai.response.id": cid, "gen_ai.agent.name": agent}
    return Span(
        span_id=f"s-{cid}",
        rollout_id="ro-1",
        seq=seq,
        name="chat",
        kind="llm",
        start_time=t - 0.1,
        end_time=t,
        attributes=attrs,
    )


def _conversation():
    """Three calls of a tool loop: each prompt is the previous prompt, its response and a tool result."""
    p1, r1 = SYSTEM + [10, 11], [20, 21, 22]
    p2, r2 = p1 + r1 + [30, 31], [23, 24]
    p3, r3 = p2 + r2 + [32], [25, 26, 27, 28]
    return [(p1, r1), (p2, r2), (p3, r3)]


def _calls(pairs, versions=("v1",) * 3):
    return [_call(f"c{k}", k, p, r, versions[k]) for k, (p, r) in enumerate(pairs)]


def _store_calls(store, pairs, agents=("solver",) * 3, versions=("v1",) * 3, spans=True):
    calls = _calls(pairs, versions)
    store.add_llm_calls(calls)
    if spans:
        store.add_spans([_span(f"c{k}", k, agents[k]) for k in range(len(pairs))])
    return calls


def _build(store, r, reader, **config):
    return build_transitions(store, [r], TransitionConfig(merge="prefix", **config), reader=reader)


def test_extending_calls_become_one_row_with_each_calls_segment(sqlite_store, reader):
    store = sqlite_store
    r = _rollout(store)
    pairs = _conversation()
    calls = _store_calls(store, pairs)
    # Two emitted rewards placed after calls 0 and 2: per-call rewards differ under "emitted" credit.
    store.add_rewards(
        [
            Reward(rollout_id="ro-1", name="progress", value=0.5, source="agent", created_at=10.5),
            Reward(rollout_id="ro-1", name="reward", value=1.0, source="agent", created_at=13.0),
        ]
    )
    (row,), report = _build(store, r, reader, credit="emitted")
    per_call, _ = build_transitions(store, [r], TransitionConfig(credit="emitted"), reader=reader)
    assert report.merged_calls == 2 and report.merge_breaks == {} and report.transitions == 1
    assert report.unmerged_tokens == sum(len(t.prompt_ids) + len(t.response_ids) for t in per_call)
    assert report.unmerged_tokens > len(row.prompt_ids) + len(row.response_ids)  # what merging saved the learner
    p1 = pairs[0][0]
    p3, r3 = pairs[2]
    assert list(row.prompt_ids) == p1
    assert list(row.response_ids) == p3[len(p1) :] + r3
    assert [(s.start, s.end, s.step, s.call_id) for s in row.segments] == [
        (0, 3, 0, "c0"),
        (5, 7, 1, "c1"),
        (8, 12, 2, "c2"),
    ]
    assert [s.reward for s in row.segments] == [t.reward for t in per_call]
    assert per_call[0].reward != per_call[1].reward  # the segments carry distinct rewards, not one broadcast
    assert row.reward == per_call[-1].reward and row.weight == per_call[0].weight == pytest.approx(1 / 3)
    for seg, call in zip(row.segments, calls, strict=True):
        assert list(row.response_ids[seg.start : seg.end]) == list(call.response_ids)
        assert list(row.response_logprobs[seg.start : seg.end]) == list(call.response_logprobs)
        assert list(row.behaviour_logprobs[seg.start : seg.end]) == list(call.behaviour_logprobs)
    assert row.response_logprobs[3:5].tolist() == [0.0, 0.0] and row.response_logprobs[7] == 0.0
    assert row.behaviour_logprobs[3:5].tolist() == [0.0, 0.0]
    Transition.model_validate(row.model_dump(mode="json"))  # the row round-trips through JSON


def test_off_by_default_one_transition_per_call(sqlite_store, reader):
    r = _rollout(sqlite_store)
    _store_calls(sqlite_store, _conversation())
    ts, report = build_transitions(sqlite_store, [r], TransitionConfig(missing_reward=0.0), reader=reader)
    assert len(ts) == 3 and all(t.segments is None for t in ts)
    assert report.merged_calls == 0 and report.merge_breaks == {} and report.unmerged_tokens == 0


def test_break_when_the_ids_do_not_extend(sqlite_store, reader):
    r = _rollout(sqlite_store)
    (p1, r1), (p2, r2), (p3, r3) = _conversation()
    p3 = list(p3)
    p3[len(p1) + 1] = 99  # the second call's prompt re-tokenized the first response differently
    _store_calls(sqlite_store, [(p1, r1), (p2, r2), (p3, r3)])
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0)
    assert [len(t.segments or [0]) for t in ts] == [2, 1]
    assert report.merged_calls == 1 and report.merge_breaks == {"not_extending": 1} and report.transitions == 2
    assert list(ts[1].prompt_ids) == p3 and ts[1].segments is None


def test_a_prompt_that_stops_inside_the_previous_response_does_not_extend(sqlite_store, reader):
    r = _rollout(sqlite_store)
    (p1, r1), _, _ = _conversation()
    _store_calls(sqlite_store, [(p1, r1), (p1 + r1[:2], [40])], spans=False)
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0)
    assert len(ts) == 2 and report.merge_breaks == {"not_extending": 1}


def test_break_between_agents(sqlite_store, reader):
    r = _rollout(sqlite_store)
    _store_calls(sqlite_store, _conversation(), agents=("solver", "solver", "checker"))
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0)
    assert [t.agent for t in ts] == ["solver", "checker"] and len(ts[0].segments) == 2
    assert report.merge_breaks == {"agent": 1}


def test_an_agent_filter_merges_the_kept_agents_calls_only(sqlite_store, reader):
    r = _rollout(sqlite_store)
    _store_calls(sqlite_store, _conversation(), agents=("solver", "checker", "solver"))
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0, agents=["solver"])
    # the checker's call is left out; the solver's third prompt still extends its first call's ids,
    # with the checker's tokens as context
    assert len(ts) == 1 and [s.call_id for s in ts[0].segments] == ["c0", "c2"]
    assert report.filtered_out == 1 and report.merged_calls == 1


def test_break_between_model_versions(sqlite_store, reader):
    r = _rollout(sqlite_store)
    _store_calls(sqlite_store, _conversation(), versions=("v1", "v2", "v2"))
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0)
    assert [t.model_version for t in ts] == ["v1", "v2"] and ts[0].segments is None and len(ts[1].segments) == 2
    assert report.merge_breaks == {"model_version": 1}


def test_break_between_policies_and_each_row_keeps_its_policy(sqlite_store, reader):
    """Both readers (the fast one reads the policy column) give each transition its call's policy."""
    r = _rollout(sqlite_store)
    calls = [
        c.model_copy(update={"policy": policy})
        for c, policy in zip(_calls(_conversation()), ("actor", "checker", "checker"), strict=True)
    ]
    sqlite_store.add_llm_calls(calls)
    sqlite_store.add_spans([_span(f"c{k}", k, "solver") for k in range(3)])
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0)
    assert [t.policy for t in ts] == ["actor", "checker"] and len(ts[1].segments) == 2
    assert report.merge_breaks == {"policy": 1}


def test_each_transition_carries_its_calls_sampling_and_calls_sampled_apart_do_not_merge(sqlite_store, reader):
    """Both readers: what the request asked for (temperature, top_p, top_k), read only when asked to."""
    r = _rollout(sqlite_store)
    asked = ({"temperature": 0.7}, {"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20})
    calls = [
        c.model_copy(update={"request": {**c.request, **sampling}})
        for c, sampling in zip(_calls(_conversation()), asked, strict=True)
    ]
    sqlite_store.add_llm_calls(calls)
    sqlite_store.add_spans([_span(f"c{k}", k, "solver") for k in range(3)])
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0, with_sampling=True)
    assert [t.sampling for t in ts] == [asked[0], asked[2]] and len(ts[0].segments) == 2
    assert report.merge_breaks == {"sampling": 1}
    unread, _ = build_transitions(sqlite_store, [r], TransitionConfig(missing_reward=0.0), reader=reader)
    assert [t.sampling for t in unread] == [None, None, None]


def test_break_at_a_text_only_call(sqlite_store, reader):
    r = _rollout(sqlite_store)
    pairs = _conversation()
    _store_calls(sqlite_store, pairs)
    # a span between calls 0 and 1 whose response id the gateway never issued: a text-only step
    sqlite_store.add_spans(
        [
            Span(
                span_id="s-text",
                rollout_id="ro-1",
                seq=9,
                name="chat",
                kind="llm",
                start_time=10.4,
                end_time=10.5,
                attributes={"gen_ai.response.id": "elsewhere", "gen_ai.agent.name": "solver"},
            )
        ]
    )
    ts, report = _build(sqlite_store, r, reader, missing_reward=0.0)
    assert [t.token_source for t in ts] == ["engine", "text", "engine"]
    assert ts[2].segments is not None and len(ts[2].segments) == 2
    assert report.merge_breaks == {"text_only": 2} and report.as_metrics()["merge_break_text_only"] == 2.0
    assert set(report.merge_breaks) <= set(BREAK_REASONS)


def test_segments_outside_the_response_are_refused():
    base = dict(rollout_id="r", task_id="t", step=0, prompt_ids=[1], response_ids=[2, 3, 4], reward=1.0)
    Transition(
        **base, segments=[Segment(start=0, end=1, step=0, reward=1.0), Segment(start=2, end=3, step=1, reward=0)]
    )
    for bad in ([(0, 4)], [(1, 1)], [(0, 2), (1, 3)]):
        with pytest.raises(ValidationError, match="segments"):
            Transition(**base, segments=[Segment(start=s, end=e, step=0, reward=0.0) for s, e in bad])


def test_the_dashboard_shows_each_merged_calls_own_credit(sqlite_store):
    from agl_trainer.dashboard.rollout import rollout_page

    r = _rollout(sqlite_store)
    _store_calls(sqlite_store, _conversation())
    sqlite_store.add_rewards(
        [
            Reward(rollout_id="ro-1", name="progress", value=0.5, source="agent", created_at=10.5),
            Reward(rollout_id="ro-1", name="reward", value=1.0, source="agent", created_at=13.0),
        ]
    )
    config = TransitionConfig(merge="prefix", credit="emitted")
    per_call, _ = build_transitions(sqlite_store, [r], config.model_copy(update={"merge": "off"}))
    html = rollout_page(sqlite_store, "ro-1", prefix="", config=config)
    shown = re.findall(r'trained</span>: reward <b class="credit">([^<]+)</b>, weight ([^<,]+)', html)
    assert shown == [(f"{t.reward:.6g}", f"{t.weight:.4g}") for t in per_call] and len(shown) == 3
