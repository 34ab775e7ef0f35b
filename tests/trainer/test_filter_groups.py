"""Dynamic sampling (``filter_groups``, verl's DAPO) in the trainer loop, on real parts.

As tests/trainer/test_trainer.py: a SqliteStore, the in-process gateway and runner, the fake
engine (tests/fake_engine.py, a test double for a model) and TinyBackend (a real, cheap backend).
The agent's reward is set by its task: ``easy`` 1 and ``hard`` 0 for every rollout (a group
without signal), ``mixed`` 1 for the group's rollout r0 and 0 for the others (a group with one).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

import agl
from agl.errors import ConfigError
from agl.schema import RolloutStatus, Transition
from agl.store.sqlite import SqliteStore
from agl_trainer.config import parse_config
from agl_trainer.group_filter import Group, GroupFilter, TooFewGroups, has_signal
from agl_trainer.trainer import Trainer
from tests.trainer.test_trainer import TinyBackend, engine, small_config  # noqa: F401 (engine: a fixture)


def graded_agent(task_input, ctx):
    """One model call through the gateway, then the reward the task's kind sets."""
    with httpx.Client(base_url=ctx.base_url, headers={"Authorization": f"Bearer {ctx.api_key}"}, timeout=30) as client:
        r = client.post("/chat/completions", json={"model": ctx.model, "messages": [{"role": "user", "content": "hi"}]})
        r.raise_for_status()
    kind = task_input["kind"]
    agl.emit_reward(1.0 if kind == "easy" or (kind == "mixed" and ctx.rollout_id.endswith("-r0")) else 0.0)


def _tasks(*kinds: str) -> list[dict]:
    return [{"task_id": f"t{i}-{kind}", "input": {"kind": kind}} for i, kind in enumerate(kinds)]


# two generation batches without enough signal, then one with a surplus group
KINDS = ("easy", "mixed", "hard", "easy", "mixed", "mixed")


def _filtered(tmp_path: Path, engine, steps: int = 1, **filter_groups) -> dict:  # noqa: F811
    config = small_config(tmp_path, engine, steps=steps, shuffle=False)
    config["filter_groups"] = {"enable": True, **filter_groups}
    return config


def _trained(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_filtered_step_draws_batches_until_it_trains_batch_size_groups_all_with_signal(tmp_path, engine):  # noqa: F811
    backend = TinyBackend(tmp_path / "calls.jsonl")
    result = Trainer(_filtered(tmp_path, engine, steps=2), backend=backend).fit(graded_agent, _tasks(*KINDS))
    assert result.steps_completed == 2
    # each step trained exactly batch_size (2) groups, both with a signal: the two first mixed tasks it met
    trained = _trained(tmp_path)
    assert [c["tasks"] for c in trained] == [["t1-mixed", "t4-mixed"], ["t1-mixed", "t4-mixed"]]
    assert [len(c["call_ids"]) for c in trained] == [4, 4]  # 2 groups x 2 rollouts x 1 call
    with SqliteStore(tmp_path / "agl.db") as store:
        rollouts = [r for r in store.query_rollouts(step=1) if r.mode == "train"]
    # 3 generation batches of 2 tasks x 2 rollouts, every one ended and kept in the store; unique ids
    assert len(rollouts) == 12 and all(r.status == RolloutStatus.SUCCEEDED for r in rollouts)
    suffixes = sorted(r.rollout_id.split("-s1", 1)[1] for r in rollouts)
    assert suffixes == sorted(f"{g}-b{b}-r{k}" for g in ("", "-g1", "-g2") for b in (0, 1) for k in (0, 1))
    assert len({r.seed for r in rollouts}) == 12
    records = [r for r in result.history if r["kind"] == "train"]
    for record in records:  # batch 1: easy (dropped) mixed; 2: hard, easy (dropped); 3: mixed, mixed (surplus)
        assert record["filter_groups/gen_batches"] == 3
        assert record["filter_groups/groups_kept"] == 2
        assert record["filter_groups/groups_dropped"] == 3
        assert record["filter_groups/groups_surplus"] == 1
        assert record["transitions"] == 4
    # the reward metrics are those of every rollout the step ran: 4 easy successes and 3 mixed ones of 12
    assert records[0]["reward_mean"] == pytest.approx(7 / 12)
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["task_cursor"] == 12 and state["config"]["filter_groups"]["enable"] is True


def test_the_groups_kept_are_those_verls_std_test_keeps(tmp_path, engine):  # noqa: F811
    """verl's DAPO keeps a prompt's group when ``np.std`` of its trajectories' metric is > 0."""
    Trainer(_filtered(tmp_path, engine), backend=TinyBackend(tmp_path / "calls.jsonl")).fit(
        graded_agent, _tasks(*KINDS)
    )
    with SqliteStore(tmp_path / "agl.db") as store:
        rollouts = [r for r in store.query_rollouts(step=1) if r.mode == "train"]
        finals = {r.rollout_id: w.value for r in rollouts for w in store.query_rewards(rollout_id=r.rollout_id)}
    groups: dict[str, list[float]] = {}
    for r in sorted(rollouts, key=lambda r: r.rollout_id):
        groups.setdefault(r.rollout_id.rsplit("-r", 1)[0], []).append(finals[r.rollout_id])
    verl_kept = [g for g, values in groups.items() if np.std(values) > 0 or len(values) == 1]
    assert sorted(verl_kept) == sorted(g for g, values in groups.items() if has_signal(values))
    assert len(verl_kept) == 3  # the three mixed tasks; the first two trained, the third surplus
    assert _trained(tmp_path)[0]["tasks"] == ["t1-mixed", "t4-mixed"]


@pytest.mark.parametrize(("limit", "completes"), [(2, False), (3, True), (0, True)])
def test_max_gen_batches_is_a_limit_past_which_the_step_stops_as_verls_does(tmp_path, engine, limit, completes):  # noqa: F811
    """verl: while short of train_batch_size, generate again unless num_gen_batches >= max (then raise)."""
    config = _filtered(tmp_path, engine, max_gen_batches=limit)
    trainer = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl"))
    if completes:
        assert trainer.fit(graded_agent, _tasks(*KINDS)).steps_completed == 1
        assert len(_trained(tmp_path)) == 1
        return
    with pytest.raises(TooFewGroups, match=r"step 1: 2 generation batch\(es\) kept 1 group.*max_gen_batches is 2"):
        trainer.fit(graded_agent, _tasks(*KINDS))
    assert _trained(tmp_path) == []  # nothing trained, the step not done
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text())["completed_step"] == 0
    with SqliteStore(tmp_path / "agl.db") as store:
        ran = [r for r in store.query_rollouts(step=1) if r.mode == "train"]
    assert len(ran) == 8 and all(r.status == RolloutStatus.SUCCEEDED for r in ran)  # kept, not lost
    # the limit may be raised on resume (verl's advice); the step then runs again whole
    again = Trainer(_filtered(tmp_path, engine, max_gen_batches=0), backend=TinyBackend(tmp_path / "calls.jsonl"))
    assert again.fit(graded_agent, _tasks(*KINDS)).steps_completed == 1
    assert [c["tasks"] for c in _trained(tmp_path)] == [["t1-mixed", "t4-mixed"]]


def test_off_the_loop_is_as_before(tmp_path, engine):  # noqa: F811
    config = small_config(tmp_path, engine, steps=2, shuffle=False)
    result = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(graded_agent, _tasks(*KINDS))
    # every step trains its batch, signal or not; the state and the ids are those of a run before the setting
    assert [c["tasks"] for c in _trained(tmp_path)] == [["t0-easy", "t1-mixed"], ["t2-hard", "t3-easy"]]
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert "task_cursor" not in state and "filter_groups" not in state["config"]
    assert not any(k.startswith("filter_groups/") for r in result.history for k in r)
    with SqliteStore(tmp_path / "agl.db") as store:
        ids = sorted(r.rollout_id.split("-s", 1)[1] for r in store.query_rollouts() if r.mode == "train")
    assert ids == sorted(f"{s}-b{b}-r{k}" for s in (1, 2) for b in (0, 1) for k in (0, 1))


class FailsAt(TinyBackend):
    """TinyBackend that fails its update at one step, as a process dying mid-step would stop the run."""

    def __init__(self, log_path: Path, fail_at: int):
        super().__init__(log_path)
        self.fail_at = fail_at

    def train_step(self, transitions, step):
        if step == self.fail_at:
            raise RuntimeError(f"stopped at step {step}")
        return super().train_step(transitions, step)


def test_a_resumed_run_takes_the_tasks_an_uninterrupted_one_does(tmp_path, engine):  # noqa: F811
    kinds = ("easy", "mixed", "hard", "mixed", "mixed", "easy", "mixed", "hard")  # steps take 2, 1, ... batches
    whole = tmp_path / "whole"
    whole.mkdir()
    Trainer(_filtered(whole, engine, steps=3), backend=TinyBackend(whole / "calls.jsonl")).fit(
        graded_agent, _tasks(*kinds)
    )
    parted = tmp_path / "parted"
    parted.mkdir()
    with pytest.raises(RuntimeError, match="stopped at step 2"):
        Trainer(_filtered(parted, engine, steps=3), backend=FailsAt(parted / "calls.jsonl", 2)).fit(
            graded_agent, _tasks(*kinds)
        )
    assert json.loads((parted / "run" / "trainer_state.json").read_text())["completed_step"] == 1
    Trainer(_filtered(parted, engine, steps=3), backend=TinyBackend(parted / "calls.jsonl")).fit(
        graded_agent, _tasks(*kinds)
    )
    assert [c["tasks"] for c in _trained(parted)] == [c["tasks"] for c in _trained(whole)]
    assert [c["step"] for c in _trained(parted)] == [1, 2, 3]
    states = [json.loads((d / "run" / "trainer_state.json").read_text()) for d in (whole, parted)]
    assert states[0]["task_cursor"] == states[1]["task_cursor"]
    weights = [json.loads((d / "run" / "checkpoints" / "step-3" / "weights.json").read_text()) for d in (whole, parted)]
    assert weights[0] == weights[1] and weights[0]["trained"] == [1, 2, 3]  # the resumed one reloaded step 1's
    seeds = []
    for d, state in zip((whole, parted), states, strict=True):
        with SqliteStore(d / "agl.db") as store:
            # the rollouts that count: step 1's of the first process, later steps' of the resumed one
            prefix = state["run_id"] + ("-resume1" if state["resumes"] else "")
            counted = [r for r in store.query_rollouts() if r.step == 1 or r.rollout_id.startswith(prefix + "-s")]
            seeds.append(sorted((r.step, r.task_id, r.seed) for r in counted if r.mode == "train"))
    assert seeds[0] == seeds[1]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rollout": {"max_staleness": 1}}, r"filter_groups.enable: cannot be used with rollout.max_staleness 1"),
        ({"from_store": {}}, r"filter_groups.enable: cannot be used with from_store"),
        ({"n_rollouts": 1}, r"filter_groups.enable: needs n_rollouts of 2 or more, not 1"),
        (
            {"policies": [{"name": "writer", "models": ["w"]}, {"name": "checker", "models": ["c"]}]},
            r"filter_groups.enable: cannot be used with several trained policies \(writer, checker\)",
        ),
        ({"filter_groups": {"enable": True, "metric": "acc"}}, r"filter_groups.metric: Input should be 'reward'"),
        ({"filter_groups": {"enable": True, "max_gen_batches": -1}}, r"filter_groups.max_gen_batches"),
    ],
)
def test_what_dynamic_sampling_cannot_honour_is_refused_naming_the_field(changes, message):
    config = {"filter_groups": {"enable": True}, **changes}
    with pytest.raises(ConfigError, match=message):
        parse_config(config)
    if "filter_groups" not in changes:  # the same settings without filtering are accepted
        parse_config({**config, "filter_groups": {"enable": False}})


def test_dynamic_sampling_takes_one_trained_policy_beside_frozen_ones():
    policies = [{"name": "writer", "models": ["w"]}, {"name": "checker", "models": ["c"], "train": False}]
    config = parse_config({"filter_groups": {"enable": True}, "policies": policies})
    assert [p.name for p in config.policies if p.train] == ["writer"]


def _transition(rollout_id: str, task_id: str, reward: float) -> Transition:
    return Transition(rollout_id=rollout_id, task_id=task_id, step=0, prompt_ids=[1], response_ids=[2], reward=reward)


def test_a_task_kept_twice_in_a_step_is_trained_once_and_a_lone_rollout_has_no_signal():
    """A small dataset's shuffle wraps around within a step; the backends group transitions by task."""
    picked = GroupFilter(2)
    batches = [
        [Group(0, "a", ("a0", "a1")), Group(0, "b", ("b0", "b1"))],
        [Group(1, "a", ("a2", "a3")), Group(1, "c", ("c0", "c1"))],
    ]
    finals = {"a0": 1, "a1": 0, "b0": 1, "b1": 0, "a2": 0, "a3": 1, "c0": 1, "c1": 0}
    # b1 made no transition: b's group, as the estimator sees it, is one rollout: no signal
    built = [_transition(r, r[0], finals[r]) for r in finals if r != "b1"]
    for batch in batches:
        picked.add(batch, [t for t in built if any(t.rollout_id in g.rollout_ids for g in batch)], finals)
    assert [g.task_id for g in picked.kept] == ["a", "c"]
    assert [t.rollout_id for t in picked.transitions] == ["a0", "a1", "c0", "c1"]
    assert picked.metrics() == {
        "filter_groups/gen_batches": 2.0,
        "filter_groups/groups_kept": 2.0,
        "filter_groups/groups_dropped": 1.0,
        "filter_groups/groups_surplus": 0.0,
        "filter_groups/groups_duplicate": 1.0,
    }
