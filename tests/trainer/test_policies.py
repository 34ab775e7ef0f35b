"""A policy per role (issue #29), on real parts: SqliteStore, the gateway, the in-process runner.

The model behind the gateway is tests/fake_engine.py (a test double for a model: these tests are
about routing, recording and bookkeeping, not about weights). Each trained policy gets its own
backend, a :class:`PolicyBackend` built by name from the config, as a user's config would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import agl
from agl.errors import ConfigError
from agl.schema import ModelVersion, RolloutStatus
from agl.store.sqlite import SqliteStore
from agl_trainer.config import parse_config
from agl_trainer.trainer import Trainer
from tests.conftest import wait_until
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, small_config

REPO = Path(__file__).resolve().parents[2]

WRITER, CHECKER = "writer-model", "checker-model"


class PolicyBackend(TinyBackend):
    """:class:`TinyBackend` that names its versions after its policy, as a backend of a named policy must."""

    def publish(self, step):
        policy = self.context.policy
        return ModelVersion(version=f"{policy}-v{step}", step=step, policy=policy)


class Backends:
    """Provides backend ``tiny``: a :class:`PolicyBackend` logging to ``<log_dir>/<label>.jsonl``."""

    @agl.hookimpl
    def agl_register_backends(self, register):
        register("tiny", lambda log_dir, label: PolicyBackend(Path(log_dir) / f"{label}.jsonl"))


def two_role_agent(task_input, ctx):
    """A writer call and a checker call, each asking for its role's model; reward 1 when the writer echoes."""
    headers = {"Authorization": f"Bearer {ctx.api_key}"}
    with httpx.Client(base_url=ctx.base_url, headers=headers, timeout=30) as client:
        replies = {}
        for model in (WRITER, CHECKER):
            r = client.post(
                "/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": task_input["word"]}]},
            )
            r.raise_for_status()
            replies[model] = r.json()
    assert replies[WRITER]["model"] == WRITER  # the client sees the name it asked for
    agl.emit_reward(float(task_input["word"] in replies[WRITER]["choices"][0]["message"]["content"]))


def policies_config(tmp_path, engine, *, checker_trains=False, **changes):
    log_dir = str(tmp_path)
    checker = {"name": "checker", "models": [CHECKER], "train": checker_trains}
    if checker_trains:
        checker["backend"] = {"label": "checker"}
    return small_config(
        tmp_path,
        engine,
        backend={"name": "tiny", "config": {"log_dir": log_dir, "label": "actor"}},
        policies=[{"name": "actor", "models": [WRITER]}, checker],
        **changes,
    )


@pytest.fixture
def engine():
    with FakeEngine() as eng:
        yield eng


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_call_goes_to_the_policy_its_model_names_and_only_trained_policies_learn(tmp_path, engine):
    agl.register_plugin(Backends(), name="tiny-backends")
    cfg = policies_config(tmp_path, engine, steps=2)
    tasks = [{"input": {"word": f"w{i}"}} for i in range(2)]
    result = Trainer(cfg).fit(two_role_agent, tasks)
    # the run's end names each policy's version, not the default policy's, which this run has not
    assert result.policy_versions == {"actor": "actor-v2", "checker": "base"}
    assert result.summary().startswith("2 steps; model versions actor actor-v2, checker base")

    store = SqliteStore(tmp_path / "agl.db")
    try:
        calls = list(store.query_llm_calls())
        assert len(calls) == 2 * 2 * 2 * 2  # steps x tasks x rollouts x roles
        by_policy = {m: {c.policy for c in calls if c.requested_model == m} for m in (WRITER, CHECKER)}
        assert by_policy == {WRITER: {"actor"}, CHECKER: {"checker"}}
        steps = {r.rollout_id: r.step for r in store.query_rollouts()}
        versions = {(c.policy, steps[c.rollout_id], c.model_version) for c in calls}
        # the actor's calls of step 2 ran on the version step 1 published; the frozen checker stays at the base
        assert versions == {
            ("actor", 1, "base"),
            ("actor", 2, "actor-v1"),
            ("checker", 1, "base"),
            ("checker", 2, "base"),
        }
        assert store.get_model_version("actor-v2").policy == "actor"
    finally:
        store.close()

    trained = _lines(tmp_path / "actor.jsonl")
    assert [t["step"] for t in trained] == [1, 2]
    actor_ids = {c.call_id for c in calls if c.policy == "actor"}
    assert all(set(t["call_ids"]) <= actor_ids and len(t["call_ids"]) == 4 for t in trained)
    assert not (tmp_path / "checker.jsonl").exists()  # a frozen policy has no backend
    records = [r for r in _lines(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    for r in records:
        assert r["policy/actor/transitions"] == 4 and r["policy/actor/calls"] == 4 and r["policy/checker/calls"] == 4
        assert "policy/checker/transitions" not in r and r["policy/actor/loss"] == 1.0 / r["step"]
        assert "loss" not in r  # a run of several policies prefixes every policy's metrics
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["policy_versions"] == {"actor": "actor-v2", "checker": "base"}


def test_a_backend_object_is_told_its_policy_and_the_version_it_trains(tmp_path, engine):
    """A backend object given to the Trainer (not built from the config) learns at setup, as a built one
    does, which engine policy it trains and, each step, which version its weights are."""

    class Told(PolicyBackend):
        def train_step(self, transitions, step):
            seen.append((step, self.context.current_version, sorted({t.model_version for t in transitions})))
            return super().train_step(transitions, step)

    seen: list = []
    backend = Told(tmp_path / "actor.jsonl")
    cfg = policies_config(tmp_path, engine, steps=2)
    Trainer(cfg, backend=backend).fit(two_role_agent, [{"input": {"word": "w0"}}, {"input": {"word": "w1"}}])
    assert backend.context.policy == "actor" and backend.context.workdir == tmp_path / "run"
    assert seen == [(1, "base", ["base"]), (2, "actor-v1", ["actor-v1"])]
    store = SqliteStore(tmp_path / "agl.db")
    try:
        assert store.get_model_version("actor-v2").policy == "actor"
    finally:
        store.close()


def test_an_agents_filter_narrows_what_a_policy_trains_on(tmp_path, engine):
    agl.register_plugin(Backends(), name="tiny-backends")
    cfg = policies_config(tmp_path, engine)
    cfg["policies"][0]["agents"] = ["nobody"]  # the actor's calls come from no agent of that name
    Trainer(cfg).fit(two_role_agent, [{"input": {"word": "w0"}}, {"input": {"word": "w1"}}])
    record = next(r for r in _lines(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train")
    assert record["policy/actor/calls"] == 4 and record["policy/actor/transitions"] == 0
    assert not (tmp_path / "actor.jsonl").exists()


def test_a_model_no_policy_answers_is_a_404_naming_the_field(tmp_path, engine):
    cfg = small_config(tmp_path, engine, policies=[{"name": "actor", "models": [WRITER]}])

    def stray_agent(task_input, ctx):
        r = httpx.post(
            f"{ctx.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {ctx.api_key}"},
            json={"model": "someone-else", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        body = r.json()["error"]
        assert r.status_code == 404 and body["param"] == "model" and body["code"] == "model_not_found"
        assert "'someone-else' is answered by no policy of this run (policies: actor)" in body["message"]
        agl.emit_reward(1.0)

    result = Trainer(cfg).fit(stray_agent, [{"input": {}}, {"input": {}}])
    assert result.history[-1]["success_rate"] == 1.0  # every rollout saw the 404 it expected


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ([{"name": "a"}, {"name": "a", "models": ["x"]}], "the name 'a' is given twice"),
        ([{"name": "a", "models": ["x"]}, {"name": "b", "models": ["x"]}], "model 'x' is named by both 'a' and 'b'"),
        ([{"name": "a", "weights": "w"}], "policies.a.weights: only a frozen policy"),
        ([{"name": "a", "train": False, "backend": {"lr": 1}}], "policies.a.backend: a frozen policy has no backend"),
        ([{"name": "a b"}], "policies.0.name: 'a b': 1-64 letters"),
        ([{"name": "a", "models": []}], "policies.0.models"),
        ([{"name": "a", "modles": ["x"]}], "policies.0.modles: not a config key"),
    ],
)
def test_bad_policies_are_config_errors_naming_the_field(policies, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config({"policies": policies})


def test_one_backend_object_cannot_train_two_policies(tmp_path, engine):
    cfg = policies_config(tmp_path, engine, checker_trains=True)
    with pytest.raises(ConfigError, match="one backend object cannot train 2 policies"):
        Trainer(cfg, backend=TinyBackend(tmp_path / "x.jsonl")).fit(two_role_agent, [{"input": {"word": "w"}}])


def _child(tmp_path: Path, engine_url: str) -> subprocess.Popen:
    code = (
        "import agl\n"
        "from pathlib import Path\n"
        "from agl_trainer.trainer import Trainer\n"
        "from tests.trainer.test_policies import Backends, policies_config, slow_two_role_agent\n"
        "from tests.fake_engine import FakeEngine\n"
        "agl.register_plugin(Backends(), name='tiny-backends')\n"
        f"t = Path({str(tmp_path)!r})\n"
        f"class E: url = {engine_url!r}\n"
        "cfg = policies_config(t, E, checker_trains=True, steps=3, batch_size=2, n_rollouts=2)\n"
        "Trainer(cfg).fit(slow_two_role_agent, [{'input': {'word': f'w{i}'}} for i in range(4)])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def slow_two_role_agent(task_input, ctx):
    """:func:`two_role_agent`, slow enough for a kill to catch rollouts in flight."""
    import time

    two_role_agent(task_input, ctx)
    time.sleep(0.3)


@pytest.mark.slow
def test_sigkill_then_resume_restores_every_policy(tmp_path, engine):
    """Two trained policies: each backend's checkpoint and version come back, each step trained once per policy."""
    workdir, db = tmp_path / "run", tmp_path / "agl.db"
    child = _child(tmp_path, engine.url)
    try:
        wait_until(lambda: db.exists() or child.poll() is not None, "the trainer has made its store", 60, step_s=0.05)
        assert child.poll() is None, child.stdout.read()
        store = SqliteStore(db)

        def step_2_runs() -> bool:
            assert child.poll() is None, child.stdout.read()
            state = workdir / "trainer_state.json"
            if not state.exists() or json.loads(state.read_text())["completed_step"] != 1:
                return False
            return any(r.step == 2 for r in store.query_rollouts(status=RolloutStatus.RUNNING))

        wait_until(step_2_runs, "step 2 has rollouts running", 60)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        state = json.loads((workdir / "trainer_state.json").read_text())
        assert state["completed_step"] == 1
        assert state["policy_versions"] == {"actor": "actor-v1", "checker": "checker-v1"}

        again = _child(tmp_path, engine.url)
        out, _ = again.communicate(timeout=120)
        assert again.returncode == 0, out
        assert "resuming run" in out
        for name in ("actor", "checker"):
            weights = json.loads((workdir / "checkpoints" / "step-3" / name / "weights.json").read_text())
            assert weights["trained"] == [1, 2, 3]  # step 1 restored from its checkpoint, then 2 and 3
            assert [t["step"] for t in _lines(tmp_path / f"{name}.jsonl")] == [1, 2, 3]
        # after the resume each policy's calls ran on its own version restored from the state
        steps = {r.rollout_id: r.step for r in store.query_rollouts()}
        versions = {(c.policy, c.model_version) for c in store.query_llm_calls() if steps[c.rollout_id] == 2}
        assert versions == {("actor", "actor-v1"), ("checker", "checker-v1")}
        state = json.loads((workdir / "trainer_state.json").read_text())
        assert state["policy_versions"] == {"actor": "actor-v3", "checker": "checker-v3"}
        store.close()
    finally:
        if child.poll() is None:
            child.kill()


def test_a_policys_own_tokens_per_s_replaces_the_trainers_estimate(tmp_path, engine):
    """A backend that ran no forward pass says tokens/s 0 under its policy's prefix; the trainer's own
    figure (all rows' tokens over a near-instant update) would be a meaningless large number beside it."""
    agl.register_plugin(Backends(), name="tiny-backends")
    Trainer(policies_config(tmp_path, engine, steps=3)).fit(two_role_agent, [{"input": {"word": "w"}}])
    records = {r["step"]: r for r in _lines(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"}
    assert records[3]["policy/actor/tokens_per_s"] == 0.0 and "tokens_per_s" not in records[3]
    assert records[2]["tokens_per_s"] > 0  # no backend figure: the trainer's estimate stays
