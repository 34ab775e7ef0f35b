"""The :class:`~agl.store.base.Store` interface's default implementations of the batched writes,
the bulk transition reads and the dashboard's reads, on a store that does not override them.

The HTTP client store (:class:`~agl.store.http.HttpStore`, a real store server over a SQLite
file) keeps none of its own: every answer here comes from the defaults, through the public
queries. Each is compared with what the SQL store behind the server answers from its own
statements, on the same records.
"""

from __future__ import annotations

import json

import pytest

from agl.credentials import new_token
from agl.errors import InvalidTransition
from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span, Task
from agl.store.base import Store
from agl.store.batch import ClaimRequest, FinishRequest, WriteBatch
from agl.store.http import HttpStore
from agl.store.listing import ROLLOUT_SORTS, RolloutListQuery
from agl.store.sqlite import SqliteStore
from agl_trainer.dashboard import queries
from agl_trainer.store_server import ServerThread
from agl_trainer.transitions import GenericReader, SqlReader, TransitionBuilder, TransitionConfig, reader_for

AGENTS = ("solver", "critic", None)


def _fill(store: SqliteStore, n: int = 24) -> list[str]:
    """``n`` rollouts over three tasks in every state, with LLM calls, LLM and tool spans (agents,
    messages), rewards (returned and emitted, some late), production spans and step records."""
    store.add_tasks([Task(task_id=f"task-{k}", input={"q": k}) for k in range(3)])
    ids = [f"ro-{i:02d}" for i in range(n)]
    store.enqueue(
        [
            Rollout(rollout_id=r, task_id=f"task-{i % 3}", step=i // 8, mode="val" if i % 5 == 0 else "train")
            for i, r in enumerate(ids)
        ]
    )
    store.claim("runner", limit=n - 4)  # four stay queued
    calls, spans, rewards = [], [], []
    for i, rid in enumerate(ids[: n - 4]):
        for j in range(2):
            cid = f"call-{i}-{j}"
            calls.append(
                LLMCall(
                    call_id=cid,
                    rollout_id=rid,
                    seq=j,
                    prompt_ids=[i, j, 7],
                    response_ids=[j + 1, 9],
                    response_logprobs=[-0.5, -0.25] if j else None,
                    request={"messages": [{"role": "user", "content": f"q{i}"}]},
                    response={"id": cid},
                    model_version=f"v{i % 2}",
                    created_at=100.0 + i + j,
                )
            )
            attributes = {"gen_ai.response.id": cid, "gen_ai.input.messages": [{"role": "user", "content": f"q{i}"}]}
            if AGENTS[(i + j) % 3] is not None:
                attributes["gen_ai.agent.name"] = AGENTS[(i + j) % 3]
            spans.append(
                Span(
                    span_id=f"s-{i}-{j}",
                    rollout_id=rid,
                    seq=j,
                    name="chat",
                    kind="llm",
                    start_time=99.0 + i + j,
                    end_time=100.0 + i + j,
                    attributes=attributes,
                )
            )
        spans.append(Span(span_id=f"tool-{i}", rollout_id=rid, seq=5, name="tool", kind="tool", start_time=101.0 + i))
        rewards.append(Reward(rollout_id=rid, name="progress", value=0.1 * i, created_at=100.5 + i))
        if i % 4 != 3:
            rewards.append(Reward(rollout_id=rid, value=i / 10, source="return", created_at=102.0 + i))
        if i % 3 == 0:
            rewards.append(Reward(rollout_id=rid, value=-1.0, source="human", created_at=103.0 + i))  # late
    store.add_llm_calls(calls)
    store.add_spans(spans)
    store.add_spans([Span(span_id=f"prod-{k}", name="chat", kind="llm") for k in range(3)])
    store.add_rewards(rewards)
    for i, rid in enumerate(ids[: n - 4]):
        status = RolloutStatus.FAILED if i % 3 == 1 else RolloutStatus.SUCCEEDED
        store.finish(rid, status, error=f"boom {i} 50%_off" if status == RolloutStatus.FAILED else None)
    for run in ("run-a", "run-b"):
        store.add_step_record(run, {"kind": "config", "step": 0, "transitions": {"credit": "final", "run": run}})
        for step in range(3 if run == "run-a" else 2):
            store.add_step_record(run, {"step": step, "reward_mean": step / 2})
    store.add_step_record("run-a", {"step": 9, "reward_mean": 1.0})  # run-a's record is the last one
    return ids


@pytest.fixture
def stores(tmp_path):
    """``(sql, http)``: a filled SQLite store, and the HTTP store served from it."""
    backing = SqliteStore(tmp_path / "agl.db")
    token = new_token(16)
    try:
        _fill(backing)
        with ServerThread(backing, token=token) as server, HttpStore(server.url, token=token) as client:
            yield backing, client
    finally:
        backing.close()


def test_the_http_store_keeps_none_of_its_own_so_the_defaults_answer():
    for name in ("write_batch", "transition_rows", "span_messages", "call_payloads", "get_tasks", "list_rollouts"):
        assert getattr(HttpStore, name) is getattr(Store, name), name
        assert getattr(SqliteStore, name) is not getattr(Store, name), name


def test_default_transition_rows_match_the_sql_stores_columns(stores):
    sql, http = stores
    ids = ["ro-00", "ro-03", "ro-07", "ro-22", "no-such-rollout"]
    mine, theirs = http.transition_rows(ids), sql.transition_rows(ids)
    for kind in ("calls", "spans", "rewards"):
        got = sorted(getattr(mine, kind).rows())
        assert got == sorted(getattr(theirs, kind).rows()), kind
        assert got, kind
    span_ids = [*theirs.spans.span_id, "no-such-span"]
    assert _decoded(http.span_messages(span_ids)) == _decoded(sql.span_messages(span_ids))
    call_ids = [*theirs.calls.call_id, "no-such-call"]
    assert _payloads(http.call_payloads(call_ids)) == _payloads(sql.call_payloads(call_ids))
    assert http.get_tasks(["task-2", "nope", "task-0"]) == sql.get_tasks(["task-2", "nope", "task-0"])
    assert set(http.get_tasks(["task-2", "nope"])) == {"task-2"}


def _decoded(found) -> dict:
    return {m.span_id: (json.loads(m.input) if m.input else m.input, m.output) for m in found}


def _payloads(found) -> dict:
    return {p.call_id: (json.loads(p.request), json.loads(p.response)) for p in found}


def test_the_builder_reads_the_same_transitions_through_the_defaults(stores):
    sql, http = stores
    assert type(reader_for(http)) is GenericReader and type(reader_for(sql)) is SqlReader
    config = TransitionConfig(credit="emitted", agent_rewards="always")
    rollouts = list(sql.query_rollouts(status=[RolloutStatus.SUCCEEDED, RolloutStatus.FAILED]))
    built = {}
    for name, store, reader in [
        ("sql", sql, SqlReader(sql)),
        ("defaults", http, SqlReader(http)),
        ("generic", http, GenericReader(http)),
    ]:
        transitions = TransitionBuilder(store, config, reader=reader).build(rollouts)
        built[name] = [(t.call_id, list(t.prompt_ids), list(t.response_ids), t.reward, t.agent) for t in transitions]
    assert built["defaults"] == built["sql"] == built["generic"]
    assert len(built["sql"]) > len(rollouts)  # most rollouts' two calls
    assert {t[4] for t in built["sql"]} == set(AGENTS) and len({t[3] for t in built["sql"]}) > 5


QUERIES = [
    RolloutListQuery(),
    RolloutListQuery(desc=False, limit=5, offset=5),
    *(RolloutListQuery(sort=sort, desc=desc, limit=7) for sort in ROLLOUT_SORTS for desc in (True, False)),
    RolloutListQuery(status=("failed",), sort="reward"),
    RolloutListQuery(task="task-1", mode="train", step=1),
    RolloutListQuery(agent="critic", sort="agent", desc=False),
    RolloutListQuery(model=None, reward_min=0.5, reward_max=1.5),
    RolloutListQuery(duration_min=0.0, error="50%_"),
    RolloutListQuery(error="*", limit=3, offset=2),
    RolloutListQuery(error="BOOM 1"),
    RolloutListQuery(status=("queued",), sort="duration"),
]


@pytest.mark.parametrize("query", QUERIES)
def test_default_rollout_pages_match_the_sql_stores_page(stores, query):
    sql, http = stores
    mine, theirs = http.list_rollouts(query), sql.list_rollouts(query)
    assert mine.total == theirs.total
    assert mine.rows == theirs.rows


def test_default_counts_runs_and_step_records_match_the_sql_store(stores):
    sql, http = stores
    assert http.count_spans(production=True) == sql.count_spans(production=True) == 3
    assert http.count_spans(rollout_id="ro-01", kind="llm") == sql.count_spans(rollout_id="ro-01", kind="llm") == 2
    assert [(r.run_id, r.records) for r in http.runs()] == [(r.run_id, r.records) for r in sql.runs()]
    assert [r.run_id for r in sql.runs()] == ["run-a", "run-b"] and all(r.last_at for r in sql.runs())
    assert http.latest_step_records("config") == sql.latest_step_records("config")
    assert queries.run_transition_configs(http) == {
        "run-a": {"credit": "final", "run": "run-a"},
        "run-b": {"credit": "final", "run": "run-b"},
    }


def test_the_dashboards_list_reads_any_store(stores):
    sql, http = stores
    flt = queries.RolloutFilter(status=["succeeded"], sort="reward", desc=False, size=25)
    assert queries.list_rollouts(http, flt) == queries.list_rollouts(sql, flt)
    assert queries.production_span_count(http) == 3


def test_the_default_batch_runs_every_part_and_settles_each(stores):
    sql, http = stores
    queued = [r.rollout_id for r in sql.query_rollouts(status="queued")]
    batch = WriteBatch(
        spans=[Span(span_id="batch-span", rollout_id=queued[0], name="s")],
        rewards=[Reward(rollout_id=queued[1], value=0.5)],
        claims=[ClaimRequest("r1", 2, "claim-b1"), ClaimRequest("r2", 0)],
        finishes=[FinishRequest("ro-00", RolloutStatus.FAILED), FinishRequest(queued[3], RolloutStatus.RUNNING)],
    )
    outcome = http.write_batch(batch)
    assert [r.rollout_id for r in outcome.claims[0]] == queued[:2]
    assert isinstance(outcome.claims[1], ValueError) and "limit" in str(outcome.claims[1])
    assert isinstance(outcome.finishes[0], InvalidTransition)  # ro-00 ended already, as succeeded
    assert isinstance(outcome.finishes[1], InvalidTransition)  # running is no terminal status
    assert [s.span_id for s in sql.query_spans(rollout_id=queued[0])] == ["batch-span"]
    assert [r.value for r in sql.query_rewards(rollout_id=queued[1])] == [0.5]
    again = http.write_batch(WriteBatch(claims=[ClaimRequest("r1", 2, "claim-b1")]))
    assert [r.rollout_id for r in again.claims[0]] == queued[:2]  # the same claim id: the same rollouts


def test_a_failed_observation_write_raises_once_the_claims_have_run(stores):
    sql, http = stores
    queued = next(sql.query_rollouts(status="queued")).rollout_id
    sql.add_spans([Span(span_id="taken", rollout_id="ro-01", name="s")])
    batch = WriteBatch(spans=[Span(span_id="taken", rollout_id="ro-02", name="s")], claims=[ClaimRequest("r9", 1)])
    with pytest.raises(Exception, match="taken"):
        http.write_batch(batch)
    assert sql.get_rollout(queued).runner_id == "r9"


def test_the_dashboard_serves_a_store_that_is_not_sql(stores):
    from starlette.testclient import TestClient

    from agl_trainer.dashboard import dashboard_app

    sql, http = stores
    app = dashboard_app(http, token="dash-token")
    with TestClient(app) as client:
        auth = {"Authorization": "Bearer dash-token"}
        page = client.get("/ui/rollouts?sort=reward&dir=asc&size=25", headers=auth)
        runs = client.get("/ui/runs", headers=auth)
        traces = client.get("/ui/traces", headers=auth)
    assert page.status_code == runs.status_code == traces.status_code == 200
    shown = sql.list_rollouts(RolloutListQuery(sort="reward", desc=False, limit=25)).rows
    positions = [page.text.index(f'data-rollout-id="{r.rollout_id}"') for r in shown]
    assert positions == sorted(positions) and "24 rollouts" in page.text
    assert (
        "run-a (5 records)" in runs.text
        and "run-b (3 records)" in runs.text
        and "3 span(s) of gateway traffic" in traces.text
    )
