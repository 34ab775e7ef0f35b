"""Asynchronous steps (``rollout.max_staleness``) and training on recorded rollouts (``from_store``).

Real parts as in test_trainer.py: a SqliteStore, the in-process gateway and runner, the
fake engine (tests/fake_engine.py, a test double for a model) and TinyBackend, a cheap real
backend; the recorded-traffic run is killed with SIGKILL and resumed in a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agl.schema import ModelVersion, Reward, RolloutStatus, Span, Transition
from agl.store.sqlite import SqliteStore
from agl_trainer.baselines import STEP_GROUP
from agl_trainer.trainer import Trainer
from tests.conftest import wait_until
from tests.trainer.test_trainer import REPO, TinyBackend, _tasks, agent, engine, small_config

__all__ = ["engine"]  # the fixture, shared with test_trainer.py


class PeekingBackend(TinyBackend):
    """TinyBackend that notes, at each update, which steps' rollouts are in the store already."""

    def __init__(self, log_path: Path, store_path: Path):
        super().__init__(log_path)
        self.store_path = store_path
        self.queued_at_update: dict[int, list[int]] = {}

    def train_step(self, transitions, step):
        with SqliteStore(self.store_path) as store:
            self.queued_at_update[step] = sorted({r.step for r in store.query_rollouts() if r.mode == "train"})
        return super().train_step(transitions, step)


def test_max_staleness_runs_the_next_steps_rollouts_while_a_step_trains(tmp_path, engine):
    config = small_config(tmp_path, engine, steps=3, **{"rollout.max_staleness": 1})
    backend = PeekingBackend(tmp_path / "calls.jsonl", tmp_path / "agl.db")
    result = Trainer(config, backend=backend).fit(agent, _tasks(4))
    assert result.steps_completed == 3
    # step n's update saw step n+1's rollouts queued (never n+2's: the bound), the last step none ahead
    assert backend.queued_at_update == {1: [1, 2], 2: [1, 2, 3], 3: [1, 2, 3]}
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["step"] for c in calls] == [1, 2, 3] and all(len(c["call_ids"]) == 8 for c in calls)
    train = [r for r in result.history if r["kind"] == "train"]
    assert [r["stale_dropped"] for r in train] == [0, 0, 0]
    assert all(r["staleness_max"] <= 1 for r in train)


def test_lockstep_queues_nothing_ahead(tmp_path, engine):
    backend = PeekingBackend(tmp_path / "calls.jsonl", tmp_path / "agl.db")
    Trainer(small_config(tmp_path, engine, steps=2), backend=backend).fit(agent, _tasks(4))
    assert backend.queued_at_update == {1: [1], 2: [1, 2]}


def test_a_transition_past_the_staleness_bound_is_dropped_and_counted(tmp_path, engine):
    trainer = Trainer(small_config(tmp_path, engine, **{"rollout.max_staleness": 1}))
    with SqliteStore(tmp_path / "agl.db") as store:
        for version, step in (("v1", 1), ("v3", 3), ("v4", 4)):
            store.add_model_version(ModelVersion(version=version, step=step))
        trainer._store = store
        trainer.policies.policies[0].version = "v4"  # the learner holds step 4's weights

        def made_on(version):
            return Transition(rollout_id="r", task_id="t", step=0, prompt_ids=[1], response_ids=[2], reward=1.0,
                              model_version=version)  # fmt: skip

        # step 5 trains on weights of step 4: v4 is 0 behind, v3 1 (the bound), v1 3
        kept, dropped = trainer._drop_stale([made_on("v1"), made_on("v3"), made_on("v4")])
    assert [t.model_version for t in kept] == ["v3", "v4"] and dropped == 1


def _record_traffic(tmp_path, engine, n_tasks: int) -> Path:
    """Rollouts to train on later: a run without a backend (its rollouts stay in the store), then graded
    by a user, as a feedback process does (the agent's own rewards are no grade)."""
    config = small_config(tmp_path / "traffic", engine, batch_size=n_tasks, n_rollouts=1, val_before=False)
    config["store"] = f"sqlite:///{tmp_path / 'agl.db'}"
    Trainer(config).fit(agent, _tasks(n_tasks))
    with SqliteStore(tmp_path / "agl.db") as store:
        own = [w for w in store.query_rewards() if w.name == "reward" and w.source == "agent"]
        assert len(own) == n_tasks
        store.add_rewards([Reward(rollout_id=w.rollout_id, value=w.value, source="user") for w in own])
    return tmp_path / "agl.db"


def _from_store_child(workdir: Path, db: Path, sleep_at_step: int | None) -> subprocess.Popen:
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "from agl_trainer.trainer import Trainer\n"
        "from tests.trainer.test_async_and_recorded import RecordingBackend\n"
        f"w = Path({str(workdir)!r})\n"
        f"cfg = {{'workdir': str(w), 'store': 'sqlite:///{db}', 'steps': 4, 'progress': False, 'plot': False,\n"
        "       'from_store': {'modes': ['train'], 'rollouts_per_step': 3}}\n"
        f"Trainer(cfg, backend=RecordingBackend(w / 'calls.jsonl', sleep_at_step={sleep_at_step!r})).fit(None, [])\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class RecordingBackend(TinyBackend):
    """TinyBackend whose checkpointed weights hold the rollouts it trained on; it can stall a step."""

    def __init__(self, log_path: Path, sleep_at_step: int | None = None):
        super().__init__(log_path)
        self.weights["rollouts"] = []
        self.sleep_at_step = sleep_at_step

    def train_step(self, transitions, step):
        self.weights["rollouts"] += sorted({t.rollout_id for t in transitions})
        metrics = super().train_step(transitions, step)
        if step == self.sleep_at_step:
            time.sleep(60)  # killed here
        return metrics


@pytest.mark.slow
def test_from_store_trains_each_recorded_rollout_once_across_a_sigkill(tmp_path, engine):
    db = _record_traffic(tmp_path, engine, n_tasks=8)
    with SqliteStore(db) as store:
        recorded = sorted(r.rollout_id for r in store.query_rollouts())
        # one rollout's model call went to a hosted model: a span with no gateway record, text only
        hosted = {
            "gen_ai.response.id": "msg_hosted",
            "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}],
            "gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}]}],
        }
        store.add_spans([Span(span_id="hosted", rollout_id=recorded[0], name="llm", kind="llm", attributes=hosted)])
    assert len(recorded) == 8
    workdir = tmp_path / "run"
    child = _from_store_child(workdir, db, sleep_at_step=2)
    calls_log = workdir / "calls.jsonl"

    def step_2_trained() -> bool:
        assert child.poll() is None, child.stdout.read()
        return calls_log.exists() and len(calls_log.read_text().splitlines()) == 2

    wait_until(step_2_trained, "step 2's update has started", 120)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert json.loads((workdir / "trainer_state.json").read_text())["completed_step"] == 1

    again = _from_store_child(workdir, db, sleep_at_step=None)
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert "no recorded rollouts left" in out  # 8 rollouts, 3 a step: the third step had 2, a fourth none
    weights = json.loads((workdir / "checkpoints" / "step-3" / "weights.json").read_text())
    assert weights["trained"] == [1, 2, 3]
    assert sorted(weights["rollouts"]) == recorded  # every one once, the killed step's counted once
    state = json.loads((workdir / "trainer_state.json").read_text())
    assert sorted(state["trained_rollouts"]) == recorded
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["recorded_rollouts"] for r in train] == [3, 3, 2]
    assert sum(r["text_only_calls"] for r in train) == 1  # counted, never trained
    calls = [json.loads(line) for line in calls_log.read_text().splitlines()]
    assert all(c["sources"] == ["engine"] for c in calls)
    # one rollout per task: the step's singletons are one group
    assert all(c["tasks"] == [STEP_GROUP] for c in calls)


def test_from_store_without_rewards_trains_nothing_and_says_so(tmp_path, engine):
    with SqliteStore(tmp_path / "agl.db") as store:
        from agl.schema import Rollout, Task

        store.add_tasks([Task(task_id="t", input={})])
        store.enqueue([Rollout(rollout_id="unrewarded", task_id="t", mode="production")])
        (claimed,) = store.claim("runner", limit=1)
        store.finish(claimed.rollout_id, RolloutStatus.SUCCEEDED)
    backend = TinyBackend(tmp_path / "calls.jsonl")
    config = {"workdir": str(tmp_path / "run"), "store": f"sqlite:///{tmp_path / 'agl.db'}", "steps": 2,
              "progress": False, "plot": False, "from_store": {}}  # fmt: skip
    result = Trainer(config, backend=backend).fit(None, [])
    assert result.steps_completed == 0 and not (tmp_path / "calls.jsonl").exists()


class SlowBackend(TinyBackend):
    """TinyBackend whose update takes a while, as a real one does."""

    def train_step(self, transitions, step):
        time.sleep(0.4)
        return super().train_step(transitions, step)


def test_production_traffic_is_served_while_recorded_traffic_trains_and_publishes(tmp_path, engine):
    import threading

    import httpx

    db = _record_traffic(tmp_path, engine, n_tasks=6)
    config = {"workdir": str(tmp_path / "run"), "store": f"sqlite:///{db}", "steps": 3, "progress": False,
              "plot": False, "engine_urls": [engine.url], "gateway": {"token": "prod-token"},
              "from_store": {"modes": ["train"], "rollouts_per_step": 2}}  # fmt: skip
    trainer = Trainer(config, backend=SlowBackend(tmp_path / "calls.jsonl"))
    done = threading.Event()
    statuses: list[int] = []

    def production_client() -> None:
        wait_until(lambda: trainer.gateway is not None, "the trainer's gateway is up", 30)
        base = trainer.gateway.base_url
        with httpx.Client(headers={"Authorization": "Bearer prod-token"}, timeout=30) as client:
            while not done.is_set():
                body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
                try:
                    statuses.append(client.post(f"{base}/chat/completions", json=body).status_code)
                except httpx.ConnectError:  # the run has ended and its gateway with it
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=production_client)
    thread.start()
    try:
        result = trainer.fit(None, [])
    finally:
        done.set()
        thread.join(30)
    assert result.steps_completed == 3 and result.model_version == "v3"
    assert len(statuses) > 10 and set(statuses) == {200}
    # served throughout, recorded under each version as it was published, never an older one again
    with SqliteStore(db) as store:
        calls = sorted(store.query_llm_calls(production=True), key=lambda c: c.created_at)
    versions = [c.model_version for c in calls]
    assert len(versions) == len(statuses)
    order = ["base", "v1", "v2", "v3"]
    assert versions == sorted(versions, key=order.index) and len(set(versions)) >= 3


def fails_at_step_2(task_input, ctx):
    """The test agent, but every rollout of step 2 fails: a step with nothing to train."""
    if "-s2-" in ctx.rollout_id:
        raise RuntimeError("the agent failed")
    agent(task_input, ctx)


def test_lockstep_goes_on_training_after_a_step_with_nothing_to_train(tmp_path, engine):
    backend = TinyBackend(tmp_path / "calls.jsonl")
    result = Trainer(small_config(tmp_path, engine, steps=4), backend=backend).fit(fails_at_step_2, _tasks(4))
    train = [r for r in result.history if r["kind"] == "train"]
    # step 2 published nothing; steps 3 and 4 ran on step 1's and step 3's weights, 0 versions behind
    assert backend.weights["trained"] == [1, 3, 4]
    assert [r["model_version"] for r in train][1:] == ["v1", "v1", "v3"]
    assert [r["stale_dropped"] for r in train] == [0, 0, 0, 0]
    assert [r["transitions"] for r in train] == [8, 0, 8, 8]
    assert result.model_version == "v4"
