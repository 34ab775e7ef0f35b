"""The behaviour every store backend shares; runs once per backend in tests/core/backends."""

from __future__ import annotations

import threading
import time

import pytest

from agl.errors import InvalidTransition, NotFound
from agl.schema import LLMCall, ModelVersion, Reward, Rollout, RolloutStatus, Span, Task


def _tasks(store, n=3, split="train"):
    tasks = [Task(task_id=f"{split}-{i}", input={"question": f"q{i}", "answer": i}, split=split) for i in range(n)]
    store.add_tasks(tasks)
    return tasks


def test_tasks_round_trip_and_are_idempotent(store):
    tasks = _tasks(store)
    store.add_tasks(tasks)  # again: a retried write
    _tasks(store, 2, split="val")
    assert list(store.query_tasks(split="train")) == tasks
    assert len(list(store.query_tasks())) == 5
    assert store.get_task("train-1") == tasks[1]
    with pytest.raises(NotFound, match="train-99"):
        store.get_task("train-99")


def test_a_rollouts_response_cap_comes_back_from_every_read(store):
    [task] = _tasks(store, 1)
    store.enqueue([Rollout(rollout_id="capped", task_id=task.task_id, max_response_tokens=64)])
    store.enqueue([Rollout(rollout_id="free", task_id=task.task_id)])
    assert store.get_rollout("capped").max_response_tokens == 64
    assert {r.rollout_id: r.max_response_tokens for r in store.query_rollouts()} == {"capped": 64, "free": None}
    assert {r.rollout_id: r.max_response_tokens for r in store.claim("runner", limit=2)} == {"capped": 64, "free": None}


def test_a_rollouts_resources_come_back_from_every_read(store):
    """The prompts an algorithm chose for a rollout (agl-apo) are what its runner claims and what reads show."""
    [task] = _tasks(store, 1)
    resources = {"system_prompt": "Answer with one number.", "few_shot": ["Question: 1+1\nAnswer: 2", "ü ✓"]}
    store.enqueue([Rollout(rollout_id="prompted", task_id=task.task_id, resources=resources, resources_version="r3")])
    store.enqueue([Rollout(rollout_id="plain", task_id=task.task_id)])
    assert store.get_rollout("prompted").resources == resources
    read = {r.rollout_id: (r.resources_version, r.resources) for r in store.query_rollouts()}
    assert read == {"prompted": ("r3", resources), "plain": (None, {})}
    claimed = {r.rollout_id: (r.resources_version, r.resources) for r in store.claim("runner", limit=2)}
    assert claimed == read
    ended = store.finish("prompted", RolloutStatus.SUCCEEDED)
    assert (ended.resources_version, ended.resources) == ("r3", resources)


def test_enqueue_needs_a_stored_task(store):
    with pytest.raises(NotFound, match="nope"):
        store.enqueue([Rollout(task_id="nope")])
    assert store.stats().rollouts == {}


def test_claim_gives_each_rollout_to_one_runner_with_its_task(store):
    tasks = _tasks(store, 2)
    rollouts = store.enqueue([Rollout(task_id=t.task_id, step=0) for t in tasks for _ in range(5)])
    got: dict[str, list[str]] = {}
    lock = threading.Lock()

    def runner(name):
        while True:
            claimed = store.claim(name, limit=2)
            if not claimed:
                return
            with lock:
                got.setdefault(name, []).extend(r.rollout_id for r in claimed)
            for r in claimed:
                assert r.status == RolloutStatus.RUNNING and r.runner_id == name and r.attempt == 1
                assert r.task is not None and r.task.task_id == r.task_id

    threads = [threading.Thread(target=runner, args=(f"runner-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [rid for ids in got.values() for rid in ids]
    assert sorted(claimed) == sorted(r.rollout_id for r in rollouts)


def test_a_retried_claim_returns_the_same_rollouts(store):
    _tasks(store, 1)
    store.enqueue([Rollout(task_id="train-0") for _ in range(4)])
    first = store.claim("r", limit=2, claim_id="claim-1")
    again = store.claim("r", limit=2, claim_id="claim-1")
    assert [r.rollout_id for r in first] == [r.rollout_id for r in again]
    assert store.stats().rollouts == {"running": 2, "queued": 2}


def test_finish_follows_the_status_machine_and_retry_policy(store):
    _tasks(store, 1)
    [r] = store.enqueue([Rollout(task_id="train-0", max_attempts=2)])
    with pytest.raises(InvalidTransition):
        store.finish(r.rollout_id, RolloutStatus.SUCCEEDED)  # still queued
    store.claim("r")
    after_fail = store.finish(r.rollout_id, RolloutStatus.FAILED, error="ValueError: boom")
    assert after_fail.status == RolloutStatus.QUEUED and after_fail.attempt == 1
    [again] = store.claim("r")
    assert again.attempt == 2
    done = store.finish(r.rollout_id, RolloutStatus.FAILED, error="ValueError: boom again")
    assert done.status == RolloutStatus.FAILED and done.error == "ValueError: boom again"
    assert done.ended_at is not None
    assert [a.status for a in store.attempts(r.rollout_id)] == [RolloutStatus.FAILED, RolloutStatus.FAILED]
    with pytest.raises(InvalidTransition):
        store.finish(r.rollout_id, RolloutStatus.SUCCEEDED)
    assert store.finish(r.rollout_id, RolloutStatus.FAILED).status == RolloutStatus.FAILED  # retried finish
    with pytest.raises(NotFound):
        store.finish("ro-missing", RolloutStatus.SUCCEEDED)


def test_output_is_stored_on_success(store):
    _tasks(store, 1)
    [r] = store.enqueue([Rollout(task_id="train-0")])
    store.claim("r")
    done = store.finish(r.rollout_id, RolloutStatus.SUCCEEDED, output={"answer": "42", "steps": [1, 2]})
    assert done.output == {"answer": "42", "steps": [1, 2]}
    assert store.get_rollout(r.rollout_id) == done


def test_a_late_finish_from_an_attempt_that_timed_out_does_not_end_the_next_one(store):
    _tasks(store, 1)
    [rollout] = store.enqueue([Rollout(task_id="train-0", max_attempts=2)])
    [first] = store.claim("slow-runner")
    store.expire(heartbeat_timeout_s=1, now=time.time() + 5)  # the slow runner went silent
    [second] = store.claim("other-runner")
    assert (second.attempt, second.runner_id) == (2, "other-runner")
    with pytest.raises(InvalidTransition, match="attempt 1 ended 'timed_out'"):
        store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED, output="late", attempt=first.attempt)
    current = store.get_rollout(rollout.rollout_id)
    assert (current.status, current.attempt, current.output) == (RolloutStatus.RUNNING, 2, None)
    done = store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED, output="4", attempt=second.attempt)
    assert (done.status, done.output) == (RolloutStatus.SUCCEEDED, "4")
    # Naming the attempt keeps a repeated finish a no-op, and a wrong number is refused.
    assert (
        store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED, output="4", attempt=2).status
        == RolloutStatus.SUCCEEDED
    )
    assert [a.status for a in store.attempts(rollout.rollout_id)] == [RolloutStatus.TIMED_OUT, RolloutStatus.SUCCEEDED]
    with pytest.raises(InvalidTransition, match="attempt 3 is not running"):
        store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED, attempt=3)


def test_expire_requeues_silent_rollouts_then_times_them_out(store):
    _tasks(store, 1)
    [r] = store.enqueue([Rollout(task_id="train-0", max_attempts=2)])
    store.claim("r")
    store.heartbeat([r.rollout_id], "r")
    assert store.expire(heartbeat_timeout_s=60) == []
    [requeued] = store.expire(heartbeat_timeout_s=60, now=time.time() + 120)
    assert requeued.status == RolloutStatus.QUEUED
    store.claim("r")
    [ended] = store.expire(heartbeat_timeout_s=60, now=time.time() + 120)
    assert ended.status == RolloutStatus.TIMED_OUT and "heartbeat" in ended.error


def test_per_rollout_timeout(store):
    _tasks(store, 1)
    [r] = store.enqueue([Rollout(task_id="train-0", timeout_s=5)])
    store.claim("r")
    [ended] = store.expire(heartbeat_timeout_s=3600, now=time.time() + 10)
    assert ended.status == RolloutStatus.TIMED_OUT and "5" in ended.error


def test_cancel(store):
    _tasks(store, 1)
    a, b = store.enqueue([Rollout(task_id="train-0"), Rollout(task_id="train-0")])
    store.claim("r")
    store.cancel([a.rollout_id, b.rollout_id])
    assert {r.status for r in store.query_rollouts()} == {RolloutStatus.CANCELLED}


def test_query_rollouts_filters(store):
    _tasks(store, 2)
    store.enqueue([Rollout(task_id="train-0", step=1), Rollout(task_id="train-1", step=2)])
    store.claim("r")
    assert [r.task_id for r in store.query_rollouts(task_id="train-1")] == ["train-1"]
    assert [r.step for r in store.query_rollouts(status=RolloutStatus.QUEUED)] == [2]
    assert [r.step for r in store.query_rollouts(status=[RolloutStatus.QUEUED, RolloutStatus.RUNNING])] == [1, 2]
    assert [r.task_id for r in store.query_rollouts(step=1)] == ["train-0"]
    assert list(store.query_rollouts(since=time.time() + 60)) == []


def test_a_query_or_finish_with_a_keyword_it_does_not_take_is_refused(store):
    [task] = _tasks(store, 1)
    [rollout] = store.enqueue([Rollout(task_id=task.task_id)])
    store.claim("r")
    for query, misspelt in [
        (store.query_rollouts, "task"),
        (store.query_spans, "kinds"),
        (store.query_llm_calls, "call_id"),
        (store.query_rewards, "productions"),
    ]:
        with pytest.raises(TypeError, match=f"{query.__name__}.*'{misspelt}'"):
            next(iter(query(**{misspelt: "x"})))
    with pytest.raises(TypeError, match="finish.*'outputs'"):
        store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED, outputs={"answer": 1})
    assert store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING


def test_wait_returns_when_all_ended(store):
    _tasks(store, 1)
    rollouts = store.enqueue([Rollout(task_id="train-0") for _ in range(3)])
    ids = [r.rollout_id for r in rollouts]

    def work():
        for r in store.claim("r", limit=3):
            time.sleep(0.05)
            store.finish(r.rollout_id, RolloutStatus.SUCCEEDED)

    threading.Thread(target=work).start()
    ended = store.wait(ids, timeout_s=10)
    assert [r.rollout_id for r in ended] == ids
    assert all(r.status == RolloutStatus.SUCCEEDED for r in ended)


def test_observations_round_trip_unchanged_and_idempotent(store):
    _tasks(store, 1)
    [r] = store.enqueue([Rollout(task_id="train-0")])
    spans = [
        Span(
            rollout_id=r.rollout_id,
            seq=i,
            name="chat",
            kind="llm",
            attributes={"gen_ai.response.id": f"c{i}", "n": [1, 2]},
        )
        for i in range(3)
    ]
    calls = [
        LLMCall(
            call_id=f"c{i}",
            rollout_id=r.rollout_id,
            seq=i,
            request={"messages": [{"role": "user", "content": "hi"}]},
            response={"choices": []},
            prompt_ids=list(range(500)),
            response_ids=[7, 8, 9],
            response_logprobs=[-0.5, -0.25, -1.0],
            model_version="v0",
            latency_s=0.01,
        )
        for i in range(3)
    ]
    rewards = [
        Reward(rollout_id=r.rollout_id, value=1.0),
        Reward(rollout_id=r.rollout_id, span_id=spans[0].span_id, name="format", value=0.5),
    ]
    for _ in range(2):  # the second time is a retry and must not duplicate
        store.add_spans(spans)
        store.add_llm_calls(calls)
        store.add_rewards(rewards)
    assert list(store.query_spans(rollout_id=r.rollout_id)) == spans
    assert list(store.query_llm_calls(rollout_id=r.rollout_id)) == calls
    assert list(store.query_rewards(rollout_id=r.rollout_id)) == rewards
    assert list(store.query_llm_calls(call_ids=["c1"])) == [calls[1]]
    assert [s.seq for s in store.query_spans(rollout_ids=[r.rollout_id], kind="llm")] == [0, 1, 2]
    stats = store.stats()
    assert (stats.spans, stats.llm_calls, stats.rewards) == (3, 3, 2)


def test_production_observations_have_no_rollout(store):
    store.add_spans([Span(name="chat", kind="llm")])
    store.add_rewards([Reward(value=0.0, source="user-feedback")])
    assert len(list(store.query_spans(production=True))) == 1
    assert len(list(store.query_rewards(production=True))) == 1


def test_late_spans_are_stored(store):
    _tasks(store, 1)
    [r] = store.enqueue([Rollout(task_id="train-0")])
    store.claim("r")
    store.finish(r.rollout_id, RolloutStatus.SUCCEEDED)
    store.add_spans([Span(rollout_id=r.rollout_id, name="late", kind="custom")])
    assert [s.name for s in store.query_spans(rollout_id=r.rollout_id)] == ["late"]


def test_queries_stream_past_one_page(store):
    store.add_spans(Span(rollout_id="ro-x", seq=i, name="s") for i in range(1234))
    seen = [s.seq for s in store.query_spans(rollout_id="ro-x")]
    assert seen == list(range(1234))


def test_model_versions(store):
    assert store.latest_model_version() is None
    store.add_model_version(ModelVersion(version="v0", path="/tmp/v0", step=0))
    store.add_model_version(ModelVersion(version="v1", path="/tmp/v1", step=1))
    store.add_model_version(ModelVersion(version="v0", path="/elsewhere"))  # no-op
    assert store.latest_model_version().version == "v1"
    assert store.get_model_version("v0").path == "/tmp/v0"
    with pytest.raises(NotFound):
        store.get_model_version("v9")


def test_ids_belong_to_their_rollout(store):
    from agl.errors import IdConflict

    store.add_spans([Span(span_id="s-own", rollout_id="ro-a", name="x")])
    store.add_spans([Span(span_id="s-own", rollout_id="ro-a", name="x")])  # the same rollout again: idempotent
    with pytest.raises(IdConflict, match="s-own"):
        store.add_spans([Span(span_id="s-own", rollout_id="ro-b", name="x")])
    with pytest.raises(IdConflict, match="c-own"):
        store.add_llm_calls([LLMCall(call_id="c-own", rollout_id="ro-a", prompt_ids=[1], response_ids=[2])])
        store.add_llm_calls([LLMCall(call_id="c-own", rollout_id=None, prompt_ids=[1], response_ids=[2])])
    with pytest.raises(IdConflict, match="rw-ro-b-a1-return"):  # the runner's id for ro-b's reward
        store.add_rewards([Reward(reward_id="rw-ro-b-a1-return", rollout_id="ro-a", value=1.0)])
    store.add_rewards([Reward(reward_id="rw-ro-b-a1-return", rollout_id="ro-b", value=0.5, source="return")])
    assert [s.rollout_id for s in store.query_spans() if s.span_id == "s-own"] == ["ro-a"]
    assert [(w.rollout_id, w.value) for w in store.query_rewards()] == [("ro-b", 0.5)]
