"""The trainer seeds each rollout from the run seed, the split, the step, the task and the
rollout's index: never from when it ran (tests/gateway/test_seeds.py: how calls get theirs)."""

from __future__ import annotations

import pytest

from agl.store.sqlite import SqliteStore
from agl_trainer import Trainer
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, _tasks, agent, small_config


def _run(tmp_path, name: str, seed: int) -> dict[str, int]:
    """One short training run; each rollout's seed, by rollout id without the run's random id."""
    with FakeEngine() as engine:
        config = small_config(tmp_path / name, engine, seed=seed, steps=2)
        Trainer(config, backend=TinyBackend(tmp_path / f"{name}.jsonl")).fit(agent, _tasks(4), _tasks(2, prefix="v"))
    store = SqliteStore(tmp_path / name / "agl.db")
    try:
        # run-<id>-s1-b0-r1 → s1-b0-r1
        return {r.rollout_id.split("-", 2)[2]: r.seed for r in store.query_rollouts()}
    finally:
        store.close()


@pytest.mark.slow
def test_the_same_config_seeds_the_same_rollouts_and_another_seed_changes_them(tmp_path):
    first, again, other = _run(tmp_path, "a", 0), _run(tmp_path, "b", 0), _run(tmp_path, "c", 1)
    assert first == again and len(first) == 2 * 2 * 2 + 2 * 2  # 8 train rollouts, 2 val tasks before and after
    assert all(seed != other[key] for key, seed in first.items() if key.startswith("s"))
    val = {seed for key, seed in first.items() if key.startswith("val")}
    assert len(val) == 2  # a val task has one seed, before and after training alike
