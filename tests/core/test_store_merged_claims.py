"""A group commit's claims and finishes run as merged statements (agl.store.claims) on the SQL backends.

``write_batch`` queues all its writes before any runs, so they share one group: these
tests drive the merged statements deterministically and compare them with what the
same calls do one at a time.
"""

from __future__ import annotations

import pytest

from agl.errors import InvalidTransition, NotFound
from agl.schema import Rollout, RolloutStatus, Task
from agl.store.batch import ClaimRequest, FinishRequest, WriteBatch
from agl.store.claims import MERGE_MAX
from tests.core.backends import BACKENDS


@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request, tmp_path):
    if request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
    with BACKENDS[request.param].open_backend(tmp_path) as store:
        store.merged = {"claims": 0, "finishes": 0}  # how many ran in a merged statement
        queue = store._queue
        for kind, name in (("claims", "claim_all"), ("finishes", "finish_all")):
            setattr(queue, name, _counting(getattr(queue, name), store.merged, kind))
        yield store


def _counting(run, merged: dict[str, int], kind: str):
    """``run`` (a merged-statement method), counting in ``merged[kind]`` the items it settled."""

    def spy(cur, items, t):
        results = run(cur, items, t)
        merged[kind] += sum(r is not None for r in results)
        return results

    return spy


def _queue(store, n, *, max_attempts=1):
    store.add_tasks([Task(task_id="t", input={"q": 1})])
    return store.enqueue([Rollout(task_id="t", max_attempts=max_attempts) for _ in range(n)])


def _batch(store, *, claims=(), finishes=()):
    """``store.write_batch`` of these claims and finishes (tuples of their arguments): their outcomes."""
    batch = WriteBatch(claims=[ClaimRequest(*c) for c in claims], finishes=[FinishRequest(*f) for f in finishes])
    outcome = store.write_batch(batch)
    return outcome.claims, outcome.finishes


def _claims(store, claims):
    claimed, _ = _batch(store, claims=claims)
    for outcome in claimed:
        if isinstance(outcome, BaseException):
            raise outcome
    return claimed


def test_merged_claims_share_the_queue_in_order_and_respect_each_limit(sql_store):
    queued = _queue(sql_store, 10)
    claimed = _claims(sql_store, [("a", 1, None), ("b", 3, None), ("c", 2, "claim-c"), ("d", 1, None)])
    assert [len(c) for c in claimed] == [1, 3, 2, 1]
    taken = [r.rollout_id for c in claimed for r in c]
    assert sorted(taken) == sorted(r.rollout_id for r in queued[:7])  # the first seven in the queue
    for runner, rollouts in zip("abcd", claimed, strict=False):
        for r in rollouts:
            assert (r.status, r.runner_id, r.attempt) == (RolloutStatus.RUNNING, runner, 1)
            assert r.task is not None and r.task.task_id == "t"
            assert [(a.attempt, a.runner_id, a.status) for a in sql_store.attempts(r.rollout_id)] == [
                (1, runner, RolloutStatus.RUNNING)
            ]
    assert len({r.claim_id for r in claimed[1]}) == 1 and claimed[2][0].claim_id == "claim-c"
    assert sql_store.stats().rollouts == {"queued": 3, "running": 7}
    assert sql_store.merged["claims"] == 4


def test_merged_claims_beyond_the_queue_get_what_is_left(sql_store):
    _queue(sql_store, 3)
    claimed = _claims(sql_store, [("a", 2, None), ("b", 2, None), ("c", 1, None)])
    assert [len(c) for c in claimed] == [2, 1, 0]


def test_a_repeated_claim_id_gets_back_what_it_took_merged_or_not(sql_store):
    _queue(sql_store, 6)
    first = _claims(sql_store, [("a", 2, "claim-a"), ("b", 1, "claim-b")])
    # The same claims again (a retry), twice in one group, next to a new claim.
    again = _claims(sql_store, [("a", 2, "claim-a"), ("x", 1, None), ("a", 2, "claim-a"), ("b", 1, "claim-b")])
    ids = lambda rollouts: sorted(r.rollout_id for r in rollouts)  # noqa: E731
    assert ids(again[0]) == ids(again[2]) == ids(first[0])
    assert ids(again[3]) == ids(first[1])
    assert len(again[1]) == 1 and again[1][0].rollout_id not in ids(first[0]) + ids(first[1])
    assert sql_store.stats().rollouts == {"queued": 2, "running": 4}


def test_more_claims_than_one_statement_holds(sql_store):
    n = MERGE_MAX * 2 + 3
    _queue(sql_store, n + 5)
    claimed = _claims(sql_store, [(f"r{i}", 1, None) for i in range(n)])
    taken = [c[0].rollout_id for c in claimed]
    assert len(set(taken)) == n
    assert sql_store.merged["claims"] == n


def test_merged_finishes_apply_each_status_and_the_retry_policy(sql_store):
    _queue(sql_store, 4, max_attempts=2)
    running = [r for c in _claims(sql_store, [(f"r{i}", 1, None) for i in range(4)]) for r in c]
    a, b, c, d = (r.rollout_id for r in running)
    _, finished = _batch(
        sql_store,
        finishes=[
            (a, RolloutStatus.SUCCEEDED, None, {"answer": 4}, None),
            (b, RolloutStatus.FAILED, "boom", None, None),  # attempts left: back in the queue
            (c, RolloutStatus.CANCELLED, "stop", None, 1),
            (d, RolloutStatus.TIMED_OUT, "late", None, 1),  # attempts left: back in the queue
        ],
    )
    assert [r.status for r in finished] == [
        RolloutStatus.SUCCEEDED,
        RolloutStatus.QUEUED,
        RolloutStatus.CANCELLED,
        RolloutStatus.QUEUED,
    ]
    assert finished[0].output == {"answer": 4} and finished[0].ended_at is not None
    assert finished[1].error == "boom" and finished[1].ended_at is None
    for rollout_id, status in [(a, "succeeded"), (b, "failed"), (c, "cancelled"), (d, "timed_out")]:
        [attempt] = sql_store.attempts(rollout_id)
        assert attempt.status.value == status and attempt.ended_at is not None
    assert sql_store.get_rollout(a) == finished[0]
    # The requeued ones run again and fail for good on their last attempt.
    again = [r for cl in _claims(sql_store, [("x", 1, None), ("y", 1, None)]) for r in cl]
    assert sorted(r.rollout_id for r in again) == sorted([b, d]) and all(r.attempt == 2 for r in again)
    _, last = _batch(sql_store, finishes=[(r.rollout_id, RolloutStatus.FAILED, "again", None, 2) for r in again])
    assert [r.status for r in last] == [RolloutStatus.FAILED, RolloutStatus.FAILED]
    assert sql_store.merged == {"claims": 6, "finishes": 6}


def test_a_bad_finish_in_a_merged_group_fails_alone(sql_store):
    _queue(sql_store, 3)
    running = [r for c in _claims(sql_store, [(f"r{i}", 1, None) for i in range(3)]) for r in c]
    a, b, c = (r.rollout_id for r in running)
    sql_store.finish(c, RolloutStatus.SUCCEEDED)
    _, finished = _batch(
        sql_store,
        finishes=[
            (a, RolloutStatus.SUCCEEDED, None, None, 1),
            ("ro-missing", RolloutStatus.SUCCEEDED, None, None, None),
            (c, RolloutStatus.FAILED, "too late", None, None),  # already succeeded
            (b, RolloutStatus.SUCCEEDED, None, None, None),
            (a, RolloutStatus.SUCCEEDED, None, None, 1),  # the same finish twice in one group: a retry
        ],
    )
    assert isinstance(finished[1], NotFound) and isinstance(finished[2], InvalidTransition)
    assert finished[0].status == finished[3].status == finished[4].status == RolloutStatus.SUCCEEDED
    assert sql_store.stats().rollouts == {"succeeded": 3}
    assert sql_store.merged["finishes"] == 2  # a and b; the others ran alone


def test_an_attempt_is_recorded_when_it_ends_and_reads_from_the_rollout_while_it_runs(sql_store):
    [queued] = _queue(sql_store, 1)
    [running] = sql_store.claim("r1")
    [attempt] = sql_store.attempts(queued.rollout_id)
    assert (attempt.attempt, attempt.runner_id, attempt.status, attempt.ended_at) == (
        1,
        "r1",
        RolloutStatus.RUNNING,
        None,
    )
    assert attempt.started_at == running.started_at
    sql_store.finish(queued.rollout_id, RolloutStatus.SUCCEEDED)
    [ended] = sql_store.attempts(queued.rollout_id)
    assert (ended.status, ended.started_at) == (RolloutStatus.SUCCEEDED, running.started_at) and ended.ended_at


def test_a_running_attempt_written_by_an_older_agl_is_ended_in_place(sql_store):
    [queued] = _queue(sql_store, 1)
    [running] = sql_store.claim("r1")
    # Older versions wrote the running attempt at claim time.
    sql_store._write(
        lambda cur: cur.execute(
            sql_store._sql(
                "INSERT INTO attempts (rollout_id, attempt, runner_id, status, started_at)"
                " VALUES (?, 1, 'r1', 'running', ?)"
            ),
            (queued.rollout_id, running.started_at),
        )
    )
    assert len(sql_store.attempts(queued.rollout_id)) == 1
    sql_store.finish(queued.rollout_id, RolloutStatus.FAILED, error="boom")
    [ended] = sql_store.attempts(queued.rollout_id)
    assert (ended.status, ended.error) == (RolloutStatus.FAILED, "boom")


def test_a_merged_finish_naming_an_attempt_that_ended_changes_nothing(sql_store):
    _queue(sql_store, 2, max_attempts=2)
    first = [r for c in _claims(sql_store, [("r1", 1, None), ("r2", 1, None)]) for r in c]
    a, b = (r.rollout_id for r in first)
    _batch(
        sql_store, finishes=[(a, RolloutStatus.FAILED, "try again", None, 1), (b, RolloutStatus.FAILED, "x", None, 1)]
    )
    again = [r for c in _claims(sql_store, [("r3", 1, None), ("r4", 1, None)]) for r in c]
    assert sorted(r.rollout_id for r in again) == sorted([a, b]) and all(r.attempt == 2 for r in again)
    # Late finishes of the first attempts arrive while the second ones run, next to a good one.
    _, finished = _batch(
        sql_store,
        finishes=[
            (a, RolloutStatus.SUCCEEDED, None, None, 1),  # too late: attempt 1 ended failed
            (b, RolloutStatus.FAILED, "x", None, 1),  # a repeat of how attempt 1 ended: a no-op
            (b, RolloutStatus.SUCCEEDED, None, None, 2),  # the running attempt: applies
        ],
    )
    assert isinstance(finished[0], InvalidTransition) and "attempt 1 ended 'failed'" in str(finished[0])
    assert finished[1].status == RolloutStatus.RUNNING and finished[1].attempt == 2
    assert finished[2].status == RolloutStatus.SUCCEEDED
    assert sql_store.get_rollout(a).status == RolloutStatus.RUNNING


def test_many_threads_claiming_and_finishing_keep_every_attempt_once(sql_store):
    """Claims with and without ids, repeated claims, failures that requeue and repeated
    finishes, from many threads at once (so groups merge them): every attempt is run by
    one runner, every repeat changes nothing, and every rollout ends with its attempts recorded."""
    import random
    import threading
    import time

    n, threads = 240, 24
    queued = _queue(sql_store, n, max_attempts=3)
    attempts_run: dict[tuple[str, int], int] = {}
    lock = threading.Lock()
    failures: list[BaseException] = []
    deadline = time.monotonic() + 120

    def runner(w: int) -> None:
        rnd = random.Random(w)
        try:
            while time.monotonic() < deadline:
                claim_id = f"claim-{w}-{rnd.random()}" if rnd.random() < 0.5 else None
                got = sql_store.claim(f"r{w}", limit=rnd.choice([1, 1, 2]), claim_id=claim_id)
                if claim_id and got and rnd.random() < 0.3:  # a retried claim gets the same rollouts
                    again = sql_store.claim(f"r{w}", limit=2, claim_id=claim_id)
                    assert sorted(r.rollout_id for r in again) == sorted(r.rollout_id for r in got)
                if not got:
                    if not {"queued", "running"} & set(sql_store.stats().rollouts):
                        return
                    time.sleep(0.001)
                    continue
                for r in got:
                    with lock:
                        assert (r.rollout_id, r.attempt) not in attempts_run
                        attempts_run[r.rollout_id, r.attempt] = w
                    status = rnd.choice([RolloutStatus.SUCCEEDED, RolloutStatus.FAILED])
                    sql_store.finish(r.rollout_id, status, attempt=r.attempt, output={"by": w})
                    if rnd.random() < 0.1:  # a retried finish: a no-op
                        sql_store.finish(r.rollout_id, status, attempt=r.attempt)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    pool = [threading.Thread(target=runner, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not failures, failures[:3]
    stats = sql_store.stats().rollouts
    assert sum(stats.values()) == n and set(stats) <= {"succeeded", "failed"}, stats
    for r in queued:
        rollout = sql_store.get_rollout(r.rollout_id)
        recorded = sql_store.attempts(r.rollout_id)
        assert [a.attempt for a in recorded] == list(range(1, rollout.attempt + 1))
        assert all((r.rollout_id, a.attempt) in attempts_run and a.ended_at for a in recorded)
        assert recorded[-1].status == rollout.status
    assert sql_store.merged["claims"] > 0 and sql_store.merged["finishes"] > 0
