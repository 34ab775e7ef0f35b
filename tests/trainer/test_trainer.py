"""The trainer loop on real parts: SqliteStore, the gateway, the in-process runner, a subprocess killed with SIGKILL.

The model behind the gateway is tests/fake_engine.py (a test double for a model). The
backend is TinyBackend below: a real, cheap implementation of agl_trainer.backend.Backend, since
what is under test is the seam (what the trainer hands the backend, when, and how it
resumes), not learning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

import agl
from agl.errors import ConfigError
from agl.plugins import register, unregister
from agl.schema import ModelVersion, RolloutStatus
from agl.store.sqlite import SqliteStore
from agl_trainer.backend import STANDALONE, Backend
from agl_trainer.config import load_config
from agl_trainer.trainer import Trainer
from tests.conftest import wait_until
from tests.fake_engine import FakeEngine

REPO = Path(__file__).resolve().parents[2]


class TinyBackend(Backend):
    """A cheap real backend: its 'weights' are the steps it trained and the reward mass it saw."""

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self.weights = {"trained": [], "reward_mass": 0.0}
        self.engine = None
        self.closed = False

    def setup(self, engine, context=STANDALONE):
        self.engine = engine
        self.context = context

    def train_step(self, transitions, step):
        with open(self.log_path, "a") as f:
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "call_ids": [t.call_id for t in transitions],
                        "tasks": sorted({t.task_id for t in transitions}),
                        "sources": sorted({t.token_source for t in transitions}),
                        "versions": sorted({t.model_version for t in transitions}),
                    }
                )
                + "\n"
            )
        self.weights["trained"].append(step)
        self.weights["reward_mass"] += sum(t.reward * t.weight for t in transitions)
        metrics = {"loss": 1.0 / step, "kl": 0.01 * step, "entropy": 0.5}
        if step == 3:  # a step on which it ran no forward pass, as a learner says of one without signal
            metrics["tokens_per_s"] = 0.0
        return metrics

    def publish(self, step):
        return ModelVersion(version=f"v{step}", step=step)

    def save_checkpoint(self, directory):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "weights.json").write_text(json.dumps(self.weights))

    def load_checkpoint(self, directory):
        self.weights = json.loads((directory / "weights.json").read_text())

    def close(self):
        self.closed = True


def agent(task_input, ctx):
    """Two model calls through the gateway, then a reward: 1 when the reply holds the task's word."""
    with httpx.Client(base_url=ctx.base_url, headers={"Authorization": f"Bearer {ctx.api_key}"}, timeout=30) as client:
        reply = ""
        for turn in range(2):
            r = client.post(
                "/chat/completions",
                json={"model": ctx.model, "messages": [{"role": "user", "content": f"{task_input['word']} {turn}"}]},
            )
            r.raise_for_status()
            reply = r.json()["choices"][0]["message"]["content"]
    if task_input.get("sleep"):
        time.sleep(task_input["sleep"])
    log = os.environ.get("AGENT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(ctx.rollout_id + "\n")
    agl.emit_reward(float(task_input["word"] in reply and task_input["word"] != "miss"))


class Hooks:
    def __init__(self):
        self.steps, self.built, self.ended = [], [], 0

    @agl.hookimpl
    def agl_step_ended(self, step, metrics):
        self.steps.append((step, metrics["reward_mean"]))

    @agl.hookimpl
    def agl_transitions_built(self, step, transitions):
        self.built.append((step, len(transitions)))

    @agl.hookimpl
    def agl_rollout_ended(self, rollout):
        self.ended += 1


@pytest.fixture
def engine():
    with FakeEngine() as eng:
        yield eng


def small_config(tmp_path, engine, **changes):
    """A one-step run against ``engine`` in ``tmp_path``, its own store there; ``changes`` as
    ``key=value`` or ``section.key=value``."""
    config = {
        "workdir": str(tmp_path / "run"),
        "store": f"sqlite:///{tmp_path / 'agl.db'}",
        "steps": 1,
        "batch_size": 2,
        "n_rollouts": 2,
        "engine_urls": [engine.url],
        "progress": False,
        "plot": False,
        "rollout": {"concurrency": 4, "heartbeat_s": 0.2},
    }
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field:
            config[section] = {**config[section], field: value}
        else:
            config[key] = value
    return config


def _tasks(n, prefix="w", **extra):
    return [{"input": {"word": "miss" if i % 2 else f"{prefix}{i}", **extra}} for i in range(n)]


def test_a_short_loop_end_to_end(tmp_path, engine):
    hooks = Hooks()
    register(hooks, name="test-hooks")
    backend = TinyBackend(tmp_path / "calls.jsonl")
    config = {
        "workdir": str(tmp_path / "run"),
        "store": f"sqlite:///{tmp_path / 'run' / 'agl.db'}",  # not the default .agl/agl.db of the working directory
        "steps": 3,
        "batch_size": 2,
        "n_rollouts": 2,
        "val_every": 2,
        "engine_urls": [engine.url],
        "progress": False,
        "rollout": {"concurrency": 4, "heartbeat_s": 0.2, "max_response_tokens": 64},
    }
    try:
        result = Trainer(config, backend=backend).fit(agent, _tasks(4), _tasks(2, prefix="v"))
    finally:
        unregister(name="test-hooks")
    assert result.steps_completed == 3 and result.model_version == "v3"
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["step"] for c in calls] == [1, 2, 3]
    for c in calls:  # 2 tasks × 2 rollouts × 2 calls, from the gateway, grouped by 2 task ids
        assert len(c["call_ids"]) == len(set(c["call_ids"])) == 8
        assert len(c["tasks"]) == 2 and c["sources"] == ["engine"]
    # rollouts ran against the version published by the step before, and the gateway recorded it
    assert [c["versions"] for c in calls] == [["base"], ["v1"], ["v2"]]
    store = SqliteStore(tmp_path / "run" / "agl.db")
    try:
        for step, version in [(1, "base"), (2, "v1"), (3, "v2")]:
            train = [r for r in store.query_rollouts(step=step) if r.mode == "train"]
            assert len(train) == 4 and {r.model_version for r in train} == {version}
            assert all(r.status == RolloutStatus.SUCCEEDED for r in train)
        assert [v.version for v in [store.get_model_version(f"v{i}") for i in (1, 2, 3)]] == ["v1", "v2", "v3"]
        val = [r for r in store.query_rollouts() if r.mode == "val"]
        assert len(val) == 2 * 3  # before, at step 2, after
        # the response cap is the rollouts' (train and val), enforced on every call by the gateway
        assert {r.max_response_tokens for r in store.query_rollouts()} == {64}
        assert {c.max_response_tokens for c in store.query_llm_calls()} == {64}
        assert {r.get("max_tokens") for r in engine.requests if "messages" in r} == {64}
    finally:
        store.close()
    records = result.history
    assert [(r["kind"], r["step"]) for r in records] == [
        ("val", 0),
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("val", 3),  # the final validation, at the last training step
    ]
    step2 = records[2]
    # the trainer's tokens/s (every transition's tokens over the update's time), unless the backend gave its own
    assert step2["tokens_per_s"] > 0 and records[3]["tokens_per_s"] == 0.0
    rows = step2["transitions"]
    assert step2["learner_tokens"] == pytest.approx(
        rows * (step2["prompt_length_mean"] + step2["response_length_mean"])
    )
    for key in (
        "reward_mean",
        "reward_std",
        "success_rate",
        "response_length_mean",
        "learner_tokens",
        "tokens_per_s",
        "staleness_mean",
        "time_rollout_s",
        "time_transitions_s",
        "time_update_s",
        "time_publish_s",
        "time_val_s",
        "loss",
        "kl",
    ):
        assert key in step2, key
    assert step2["staleness_max"] == 0 and step2["transitions"] == 8
    assert 0 <= step2["reward_mean"] <= 1 and step2["val_rollouts"] == 2
    assert result.before["val_rollouts"] == 2 and result.before["val_reward_mean"] == 0.5  # "v0" hits, "miss" misses
    assert result.reward_curve.exists() and result.reward_curve.stat().st_size > 1000
    assert "| reward (mean) | 0.500 | 0.500 | +0.000 |" in (tmp_path / "run" / "before_after.md").read_text()
    assert [s for s, _ in hooks.steps] == [1, 2, 3] and hooks.built == [(1, 8), (2, 8), (3, 8)] and hooks.ended == 12
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-3"]
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text())["completed_step"] == 3
    assert backend.closed


def _child(workdir: Path, engine_url: str, agent_log: Path, max_staleness: int = 0) -> subprocess.Popen:
    code = (
        "import sys, logging; logging.basicConfig(level=logging.INFO)\n"
        "from pathlib import Path\n"
        "from agl_trainer.trainer import Trainer\n"
        "from tests.trainer.test_trainer import TinyBackend, agent, _tasks\n"
        f"w = Path({str(workdir)!r})\n"
        "cfg = {'workdir': str(w), 'store': f'sqlite:///{w}/agl.db',\n"
        "       'steps': 4, 'batch_size': 2, 'n_rollouts': 2, 'progress': False, 'plot': False,\n"
        f"       'engine_urls': [{engine_url!r}],\n"
        f"       'rollout': {{'concurrency': 2, 'heartbeat_s': 0.2, 'max_staleness': {max_staleness}}}}}\n"
        "Trainer(cfg, backend=TinyBackend(w / 'calls.jsonl')).fit(agent, _tasks(4, sleep=0.3))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), AGENT_LOG=str(agent_log))
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_tasks_are_batched_in_a_seeded_shuffle_or_in_the_order_given(tmp_path, engine, shuffle):
    tasks = [{"task_id": f"t{i}", "input": {"word": f"w{i}"}} for i in range(5)]
    config = small_config(tmp_path, engine, steps=3, n_rollouts=1, shuffle=shuffle)
    Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, tasks)
    with SqliteStore(tmp_path / "agl.db") as store:
        by_step = [sorted(r.task_id for r in store.query_rollouts(step=s) if r.mode == "train") for s in (1, 2, 3)]
    if shuffle:  # an epoch of the five in a seeded order (step 3 ends it), then the next epoch's first
        first_four = set(by_step[0] + by_step[1])
        (fifth,) = {t["task_id"] for t in tasks} - first_four
        assert len(first_four) == 4 and fifth in by_step[2]
        assert by_step != [["t0", "t1"], ["t2", "t3"], ["t0", "t4"]]
    else:  # as given, from the first again after the last
        assert by_step == [["t0", "t1"], ["t2", "t3"], ["t0", "t4"]]


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 1])
def test_sigkill_mid_step_then_resume_loses_nothing_and_counts_nothing_twice(tmp_path, engine, max_staleness):
    """Lockstep, and asynchronous (step 3's rollouts queued, maybe running, when step 2 is killed)."""
    workdir = tmp_path / "run"
    agent_log = tmp_path / "agent_runs.log"
    child = _child(workdir, engine.url, agent_log, max_staleness)
    db = workdir / "agl.db"

    def store_made() -> bool:
        assert child.poll() is None, child.stdout.read()
        return db.exists()

    wait_until(store_made, "the trainer has made its store", 60, step_s=0.05)
    store = SqliteStore(db)
    try:
        # Kill while step 2 is running: step 1 completed, some of step 2's rollouts (or, asynchronous,
        # step 3's) in flight.
        def step_2_runs() -> bool:
            assert child.poll() is None, child.stdout.read()
            state = workdir / "trainer_state.json"
            if not state.exists() or json.loads(state.read_text())["completed_step"] != 1:
                return False
            return any(r.step >= 2 for r in store.query_rollouts(status=RolloutStatus.RUNNING))

        wait_until(step_2_runs, "step 2 has rollouts running", 60)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        ended_before_kill = {r.rollout_id for r in store.query_rollouts() if r.status.terminal}
        interrupted = {r.rollout_id for r in store.query_rollouts(status=RolloutStatus.RUNNING)}
        assert interrupted, "the kill should catch rollouts in flight"
        state = json.loads((workdir / "trainer_state.json").read_text())
        assert state["completed_step"] == 1

        again = _child(workdir, engine.url, agent_log, max_staleness)
        out, _ = again.communicate(timeout=120)
        assert again.returncode == 0, out
        assert "resuming run" in out

        # The backend's weights hold every step exactly once (the resumed one reloaded step 1's checkpoint).
        weights = json.loads((workdir / "checkpoints" / "step-4" / "weights.json").read_text())
        assert weights["trained"] == [1, 2, 3, 4]
        calls = [json.loads(line) for line in (workdir / "calls.jsonl").read_text().splitlines()]
        assert [c["step"] for c in calls] == [1, 2, 3, 4]
        for c in calls:
            assert len(c["call_ids"]) == len(set(c["call_ids"])) == 8  # one attempt's calls per rollout, none twice
        # The interrupted step ran again whole under the resume's ids: every step trained 4 rollouts that
        # succeeded; what the killed trainer left running or queued was cancelled, never retried.
        state = json.loads((workdir / "trainer_state.json").read_text())
        assert state["resumes"] == 1
        for step in (1, 2, 3, 4):
            rollouts = list(store.query_rollouts(step=step))
            trained = [r for r in rollouts if r.rollout_id.startswith(f"{state['run_id']}-resume1-") or step == 1]
            assert len(trained) == 4 and all(r.status == RolloutStatus.SUCCEEDED for r in trained)
        for rid in interrupted:
            assert store.get_rollout(rid).status == RolloutStatus.CANCELLED
            attempts = store.attempts(rid)
            assert len(attempts) == 1 and "TrainerRestarted" in attempts[0].error
        runs = Counter((agent_log.read_text()).split())
        assert all(runs[rid] == 1 for rid in ended_before_kill)  # ended rollouts were not run again
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    finally:
        store.close()
        if child.poll() is None:
            child.kill()


@pytest.mark.parametrize(
    ("told", "message"),
    [
        (0.7, r"rollout.resources.temperature: 0.7 tells the agents .* the backend's 0.5"),
        ("warm", r"rollout.resources.temperature: must be a number, not 'warm'"),
    ],
)
def test_agents_told_another_temperature_than_the_backend_assumes_are_refused(tmp_path, engine, told, message):
    backend = TinyBackend(tmp_path / "calls.jsonl")
    backend.sampling_temperature = 0.5
    config = small_config(tmp_path, engine, **{"rollout.resources": {"temperature": told}})
    with pytest.raises(ConfigError, match=message):
        Trainer(config, backend=backend).fit(agent, _tasks(2))
    assert backend.engine is None and not (tmp_path / "calls.jsonl").exists()  # refused before setup

    backend.sampling_temperature = 0.7  # told what it assumes: the run goes on
    config = small_config(tmp_path, engine, **{"rollout.resources": {"temperature": 0.7}})
    assert Trainer(config, backend=backend).fit(agent, _tasks(2)).steps_completed == 1


def test_config_files_load_in_every_format_and_errors_name_the_field(tmp_path):
    (tmp_path / "t.yaml").write_text("steps: 3\nrollout:\n  concurrency: 8\ntransitions:\n  credit: emitted\n")
    (tmp_path / "t.json").write_text(json.dumps({"trainer": {"steps": 3, "rollout": {"concurrency": 8}}}))
    (tmp_path / "t.toml").write_text("steps = 3\n[rollout]\nconcurrency = 8\n")
    for name in ("t.yaml", "t.json", "t.toml"):
        cfg = load_config(tmp_path / name)
        assert cfg.steps == 3 and cfg.rollout.concurrency == 8
    assert load_config(tmp_path / "t.yaml", {"rollout.timeout_s": 5}).rollout.timeout_s == 5
    (tmp_path / "bad.yaml").write_text("steps: 0\nrollout:\n  concurency: 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "bad.yaml")
    assert "steps: Input should be greater than or equal to 1" in str(err.value)
    assert "rollout.concurency: not a config key (did you mean rollout.concurrency?)" in str(err.value)
    with pytest.raises(ConfigError, match="unknown format '.ini'"):
        (tmp_path / "x.ini").write_text("")
        load_config(tmp_path / "x.ini")


def test_dotlist_overrides_type_their_values_as_yaml(tmp_path):
    from agl_trainer.config import apply_overrides

    (tmp_path / "t.yaml").write_text("steps: 3\nrollout:\n  concurrency: 2\n  model: m-${x}\nbackend:\n")
    cfg = load_config(
        tmp_path / "t.yaml",
        [
            "rollout.concurrency=8",
            "rollout.timeout_s=1e-1",
            "val_before=false",
            "engine_urls=[http://a:1, http://b:2]",
            "backend.name=verl",
            "backend.config={lr: 1e-6, mode: local}",
            "rollout.resources.tag=8x=y",
            "store=",
        ],
    )
    assert cfg.steps == 3 and cfg.rollout.concurrency == 8 and cfg.rollout.timeout_s == 0.1
    assert cfg.val_before is False and cfg.engine_urls == ["http://a:1", "http://b:2"]
    assert (
        cfg.backend is not None and cfg.backend.name == "verl" and cfg.backend.config == {"lr": 1e-6, "mode": "local"}
    )
    assert cfg.rollout.resources == {"tag": "8x=y"} and cfg.store is None
    assert cfg.rollout.model == "m-${x}"  # strings stay as written: no interpolation
    # a dict merges into the dict it overrides; a mapping's values are taken as given; the input is not changed
    data = {"backend": {"name": "verl", "config": {"lr": 1.0, "mode": "local"}}}
    out = apply_overrides(data, ["backend.config={lr: 2}"])
    assert out["backend"]["config"] == {"lr": 2, "mode": "local"} and data["backend"]["config"]["lr"] == 1.0
    assert apply_overrides({}, {"workdir": "123", "rollout.concurrency": 8}) == {
        "workdir": "123",
        "rollout": {"concurrency": 8},
    }


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.concurrency"], "override 'rollout.concurrency': expected KEY=VALUE"),
        (["rollout..concurrency=8"], "override 'rollout..concurrency': a key is dot-separated names"),
        (["=8"], "override '': a key is dot-separated names"),
        ({"rollout.concurrency ": 8}, "override 'rollout.concurrency ': a key is dot-separated names"),
        (["engine_urls=[http://a, "], "override 'engine_urls': '[http://a, ' is not a YAML value"),
        (["engine_urls.0=http://b"], "override 'engine_urls.0': does not fit the config"),
        (["rollout.concurency=8"], "rollout.concurency: not a config key (did you mean rollout.concurrency?)"),
        (["rollout.zzz=8"], "rollout.zzz: not a config key (the keys there: runners, concurrency, timeout_s,"),
        (["backend.confg={}"], "backend.confg: not a config key (did you mean backend.config?)"),
        (["rollout.concurrency=many"], "rollout.concurrency: Input should be a valid integer"),
    ],
)
def test_bad_overrides_are_config_errors_naming_the_key(tmp_path, overrides, message):
    (tmp_path / "t.yaml").write_text("engine_urls: [http://a]\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "t.yaml", overrides)
    assert message in str(err.value)


@pytest.mark.slow
def test_agl_train_cli_runs_a_loop_from_a_config_file(tmp_path, engine):
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in _tasks(2)))
    (tmp_path / "train.yaml").write_text(
        f"workdir: {tmp_path / 'run'}\nsteps: 1\nbatch_size: 2\nn_rollouts: 1\nprogress: false\nplot: false\n"
        f"engine_urls: ['{engine.url}']\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))",
            "train",
            "tests.trainer.test_trainer:agent",
            "--config",
            str(tmp_path / "train.yaml"),
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # no backend: it says it trained nothing, never "trained 1 steps"
    assert "agl: ran 1 step, no backend: nothing trained" in proc.stderr and "agl: trained" not in proc.stderr
    assert "no backend configured" in proc.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 1 and records[0]["rollouts"] == 2 and records[0]["transitions"] == 4
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))",
            "train",
            "tests.trainer.test_trainer:agent",
            "--set",
            "steps=0",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "steps: Input should be greater than or equal to 1" in bad.stderr


class GradeEverything:
    """A reward plugin: every rollout gets 1."""

    @agl.hookimpl
    def agl_reward(self, rollout):
        return 1.0


@pytest.mark.parametrize(("agent_rewards", "warned"), [("without_plugin", True), ("always", False)])
def test_emitted_credit_whose_emitted_rewards_a_plugin_overrides_is_warned_about(
    tmp_path, engine, caplog, agent_rewards, warned
):
    """``emitted`` credit with a reward plugin and the default agent_rewards would be broadcast in effect."""
    agl.register_plugin(GradeEverything(), name="grade-everything")
    config = small_config(tmp_path, engine, transitions={"credit": "emitted", "agent_rewards": agent_rewards})
    with caplog.at_level("WARNING", logger="agl_trainer.trainer"):
        Trainer(config).fit(agent, _tasks(2))
    said = [r.getMessage() for r in caplog.records if "transitions.agent_rewards" in r.getMessage()]
    assert bool(said) is warned
    if warned:
        assert "set transitions.agent_rewards: always" in said[0]
