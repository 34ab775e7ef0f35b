"""Validation at the edge (issue 16): bad numbers, deep JSON and every status change, on the
embedded store and over HTTP, each refused with an error that names the field or the status."""

from __future__ import annotations

import contextlib
import sqlite3
import struct

import httpx
import pytest
from pydantic import ValidationError

from agl.credentials import new_token
from agl.errors import ConfigError, InvalidTransition
from agl.schema import (
    ALLOWED_TRANSITIONS,
    INT64_MAX,
    MAX_JSON_DEPTH,
    LLMCall,
    Reward,
    Rollout,
    RolloutStatus,
    Span,
    Task,
    check_json,
)
from agl.store.base import open_store
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@contextlib.contextmanager
def _served(tmp_path):
    backing = SqliteStore(tmp_path / "served.db")
    token = new_token(16)
    try:
        with (
            ServerThread(backing, token=token) as server,
            httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as raw,
            HttpStore(server.url, token=token, backoff_s=0.01) as client,
        ):
            yield backing, client, raw
    finally:
        backing.close()


@pytest.fixture(params=["sqlite", "http", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        with SqliteStore(tmp_path / "agl.db") as s:
            yield s
    elif request.param == "postgres":
        from tests.core.backends import postgres

        request.applymarker(pytest.mark.postgres)
        with postgres.open_backend(tmp_path) as s:
            yield s
    else:
        with _served(tmp_path) as (_, client, _raw):
            yield client


# -- the models ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Reward(value=float("nan")), "value"),
        (lambda: Reward(value=float("-inf")), "value"),
        (lambda: Span(name="s", start_time=float("nan")), "start_time"),
        (lambda: Span(name="s", end_time=float("inf")), "end_time"),
        (lambda: Span(name="s", seq=2**64), "seq"),
        (lambda: Span(name="s", attributes={"x": [1, {"y": float("nan")}]}), "attributes.x"),
        (lambda: Span(name="s", attributes={"n": 2**80}), "attributes.n"),
        (lambda: Task(input=_nested(MAX_JSON_DEPTH + 1)), "input"),
        (lambda: Rollout(task_id="t", step=-(2**63) - 1), "step"),
        (lambda: Rollout(task_id="t", created_at=float("nan")), "created_at"),
        (lambda: LLMCall(call_id="c", prompt_ids=[1], response_ids=[2], latency_s=float("inf")), "latency_s"),
        (lambda: LLMCall(call_id="c", prompt_ids=[1], response_ids=[2], request={"m": _nested(80)}), "request"),
    ],
)
def test_models_refuse_what_no_store_can_keep_naming_the_field(make, field):
    with pytest.raises(ValidationError) as caught:
        make()
    error = caught.value.errors()[0]
    name, _, inner = field.partition(".")
    assert error["loc"] == (name,)
    if inner:  # a part of a JSON field: the message goes on with the path
        assert error["msg"].startswith(f"at {inner}")


def test_bounded_json_is_accepted_and_the_path_is_named():
    Task(input=_nested(MAX_JSON_DEPTH - 1))
    Span(name="s", seq=INT64_MAX, attributes={"n": -(2**63), "f": 1e308})
    with pytest.raises(ValueError, match=r"^output\.scores\[2\]: must be a finite number, got nan$"):
        check_json({"scores": [0.5, 1, float("nan")]}, "output")
    with pytest.raises(ValueError, match=r"^output: nests deeper than 64 levels$"):
        check_json(_nested(5000), "output")


# -- the stores ------------------------------------------------------------------
def _rollout(store, **fields) -> Rollout:
    store.add_tasks([Task(task_id="t0", input={"q": 1})])
    [rollout] = store.enqueue([Rollout(task_id="t0", **fields)])
    return rollout


def test_a_non_finite_finish_output_is_refused_naming_the_field(store):
    rollout = _rollout(store)
    [claimed] = store.claim("r1")
    with pytest.raises(ValueError, match=r"output\.score: must be a finite number"):
        store.finish(rollout.rollout_id, RolloutStatus.SUCCEEDED, output={"score": float("nan")}, attempt=1)
    assert store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING
    done = store.finish(claimed.rollout_id, RolloutStatus.SUCCEEDED, output={"score": 1.0}, attempt=1)
    assert done.output == {"score": 1.0}


def _into(store, status: RolloutStatus) -> str:
    rollout = _rollout(store, max_attempts=1)
    if status != RolloutStatus.QUEUED:
        [claimed] = store.claim("r1")
        assert claimed.rollout_id == rollout.rollout_id
        if status != RolloutStatus.RUNNING:
            store.finish(rollout.rollout_id, status)
    assert store.get_rollout(rollout.rollout_id).status == status
    return rollout.rollout_id


@pytest.mark.parametrize("current", list(RolloutStatus))
def test_every_finish_from_every_status_works_or_names_the_status(store, current):
    for target in sorted(s for s in RolloutStatus if s.terminal):
        rollout_id = _into(store, current)
        if target in ALLOWED_TRANSITIONS[current] or target == current:
            done = store.finish(rollout_id, target)
            assert done.status == target and done.ended_at is not None
        else:
            with pytest.raises(InvalidTransition, match=f"from {current.value!r} to {target.value!r}"):
                store.finish(rollout_id, target)
            assert store.get_rollout(rollout_id).status == current
        # whatever happened, cancelling it is allowed (a no-op once it has ended)
        store.cancel([rollout_id])
        assert store.get_rollout(rollout_id).status.terminal


def test_cancelling_a_queued_rollout_by_finish_ends_it_without_an_attempt(store):
    rollout = _rollout(store)
    done = store.finish(rollout.rollout_id, RolloutStatus.CANCELLED, error="not needed")
    assert done.status == RolloutStatus.CANCELLED and done.error == "not needed"
    assert store.attempts(rollout.rollout_id) == []
    assert store.claim("r1") == []  # it is out of the queue
    assert store.finish(rollout.rollout_id, RolloutStatus.CANCELLED).status == RolloutStatus.CANCELLED


def test_the_server_answers_422_naming_the_field_for_bad_numbers_and_depth(tmp_path):
    with _served(tmp_path) as (backing, _client, raw):
        raw.post("/v1/tasks", json={"tasks": [{"task_id": "t0", "input": 1}]}).raise_for_status()
        cases = [
            (b'{"spans": [{"name": "s", "start_time": NaN}]}', "/v1/spans", "spans.0.start_time"),
            (b'{"rewards": [{"value": Infinity}]}', "/v1/rewards", "rewards.0.value"),
            (b'{"rewards": [{"value": 1, "seq": 99999999999999999999}]}', "/v1/rewards", "rewards.0.seq"),
            (b'{"spans": [{"name": "s", "attributes": {"a": -Infinity}}]}', "/v1/spans", "spans.0.attributes.a"),
            (b'{"spans": [{"name": "s", "attributes": {"a": 1e999}}]}', "/v1/spans", "spans.0.attributes.a"),
            (b'{"rollouts": [{"task_id": "t0", "created_at": NaN}]}', "/v1/rollouts", "rollouts.0.created_at"),
            (
                b'{"rollouts": [{"task_id": "t0", "attempt": 18446744073709551616}]}',
                "/v1/rollouts",
                "rollouts.0.attempt",
            ),  # noqa: E501
            (b'{"spans": [{"name": "s", "seq": 1e400}]}', "/v1/batch", "spans.0.seq"),
        ]
        nested = b'{"tasks": [{"input": ' + b"[" * 70 + b"]" * 70 + b"}]}"
        cases.append((nested, "/v1/tasks", "tasks.0.input"))
        for body, path, field in cases:
            answer = raw.post(path, content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 422, (path, answer.text)
            assert answer.json()["error"]["field"] == field, answer.text
        for route in ("/v1/spans", "/v1/batch", "/v1/tasks", "/v1/claims"):
            deep = raw.post(route, content=b'{"spans": ' + b"[" * 5000 + b"]" * 5000 + b"}")
            assert deep.status_code == 422 and deep.json()["error"]["field"] == "body", deep.text
        stats = backing.stats()
        assert (stats.spans, stats.rewards, sum(stats.rollouts.values())) == (0, 0, 0)


def test_the_server_answers_409_naming_the_status(tmp_path):
    with _served(tmp_path) as (_backing, client, raw):
        rollout = _rollout(client)
        client.finish(rollout.rollout_id, RolloutStatus.CANCELLED)
        again = raw.post(f"/v1/rollouts/{rollout.rollout_id}/finish", json={"status": "succeeded"})
        assert again.status_code == 409
        assert "from 'cancelled' to 'succeeded'" in again.json()["error"]["reason"]
        queued = _rollout(client)
        early = raw.post(f"/v1/rollouts/{queued.rollout_id}/finish", json={"status": "failed"})
        assert early.status_code == 409 and "from 'queued' to 'failed'" in early.json()["error"]["reason"]
        batch = raw.post("/v1/batch", json={"finishes": [{"rollout_id": queued.rollout_id, "status": "cancelled"}]})
        assert batch.status_code == 200 and batch.json()["finishes"][0]["rollout"]["status"] == "cancelled"


# -- SQLite URLs (what tests/core/test_store_url.py does not cover) --------------------
def test_sqlite_urls_that_name_no_usable_file_are_config_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "not-a-db").write_bytes(b"these bytes are not a SQLite database header" * 4)
    cases = {
        f"sqlite:///{tmp_path}": "is a directory; name a file in it",
        "sqlite:///a-file/agl.db": "a file is in the way",
        "sqlite:///not-a-db": "cannot be opened as a SQLite database",
        "sqlite:///": "a sqlite url is sqlite:///relative/path.db",
        "sqlite:/x.db": "a sqlite url is sqlite:///relative/path.db",
    }
    for url, reason in cases.items():
        with pytest.raises(ConfigError, match=reason):
            open_store(url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "not-a-db"]  # nothing created


# -- the runner ------------------------------------------------------------------
def test_a_runner_fails_a_rollout_whose_agent_returns_a_non_finite_reward(tmp_path):
    from agl.runner import RolloutResult, Runner

    with SqliteStore(tmp_path / "agl.db") as store:
        store.add_tasks([Task(task_id=f"t{i}", input={"i": i}) for i in range(3)])
        store.enqueue([Rollout(rollout_id=f"ro{i}", task_id=f"t{i}") for i in range(3)])

        def agent(task_input):
            return [float("nan"), RolloutResult(output={"kept": True}, reward=float("inf")), 1.0][task_input["i"]]

        runner = Runner(agent, store)
        try:
            counts = runner.run_sync(until_idle=True)
        finally:
            runner.close()
        assert counts == {"failed": 2, "succeeded": 1}
        for rid in ("ro0", "ro1"):
            ended = store.get_rollout(rid)
            assert ended.status == RolloutStatus.FAILED and "reward: the agent returned" in ended.error
        assert store.get_rollout("ro1").output == {"kept": True}
        assert [(r.rollout_id, r.value) for r in store.query_rewards()] == [("ro2", 1.0)]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "out: must be a finite number, got nan"),
        ([1, 2, [3, {"a": (4, -float("inf"))}]], "out[2][1].a[1]: must be a finite number, got -inf"),
        ({"n": [True, None, "x", 2**63]}, "out.n[3]: integer out of the 64-bit range"),
        ({"n": {"m": -(2**63) - 1}}, "out.n.m: integer out of the 64-bit range"),
        ([_nested(MAX_JSON_DEPTH)], "out: nests deeper than 64 levels"),
    ],
)
def test_every_bad_part_of_json_is_found_wherever_it_sits(value, message):
    with pytest.raises(ValueError) as caught:
        check_json(value, "out")
    assert str(caught.value) == message
    check_json({"ok": [True, None, "x", 2**63 - 1, -(2**63), 1e308, -0.0, (1, 2.5)]}, "out")


def test_a_store_reads_its_own_records_back_without_checking_them_again(tmp_path):
    # what a store wrote was checked then; reading it back (transitions read every call) does not check again
    with SqliteStore(tmp_path / "agl.db") as store:
        store.add_llm_calls([LLMCall(call_id="c1", prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.5])])
        with (
            contextlib.closing(sqlite3.connect(tmp_path / "agl.db")) as conn,
            conn,
        ):  # as if a build without checks wrote it
            conn.execute("UPDATE llm_calls SET prompt_ids = ? WHERE call_id = 'c1'", (struct.pack("<2i", 1, -2),))
        [call] = store.query_llm_calls()
        assert list(call.prompt_ids) == [1, -2]
