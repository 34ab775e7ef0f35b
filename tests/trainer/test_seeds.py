"""The trainer seeds each rollout from the run seed, the split, the step, the task and the
rollout's index: never from when it ran (tests/gateway/test_seeds.py: how calls get theirs)."""

from __future__ import annotations

import pytest

from agl_trainer import Trainer
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, _tasks, agent


def _run(tmp_path, name: str, seed: int) -> dict[str, list[int]]:
    """One short training run; the seeds its calls carried, by rollout (its run id stripped)."""
    with FakeEngine() as engine:
        config = {
            "workdir": str(tmp_path / name),
            "store": f"sqlite:///{tmp_path / name}.db",
            "seed": seed,
            "steps": 2,
            "batch_size": 2,
            "n_rollouts": 2,
            "engine_urls": [engine.url],
            "progress": False,
            "plot": False,
            "rollout": {"concurrency": 4, "heartbeat_s": 0.2},
        }
        Trainer(config, backend=TinyBackend(tmp_path / f"{name}.jsonl")).fit(agent, _tasks(4), _tasks(2, prefix="v"))
        from agl.store.sqlite import SqliteStore

        store = SqliteStore(tmp_path / f"{name}.db")
        try:
            by_rollout: dict[str, list[int]] = {}
            for rollout in store.query_rollouts():
                key = rollout.rollout_id.split("-", 2)[2]  # run-<id>-s1-b0-r1 → s1-b0-r1
                by_rollout[key] = [rollout.seed]
            return by_rollout
        finally:
            store.close()


@pytest.mark.slow
def test_the_same_config_seeds_the_same_rollouts_and_another_seed_changes_them(tmp_path):
    first, again, other = _run(tmp_path, "a", 0), _run(tmp_path, "b", 0), _run(tmp_path, "c", 1)
    assert first == again and len(first) == 2 * 2 * 2 + 2 * 2  # 8 train rollouts, 2 val tasks before and after
    assert all(seeds != other[key] for key, seeds in first.items() if key.startswith("s"))
    val = {tuple(seeds) for key, seeds in first.items() if key.startswith("val")}
    assert len(val) == 2  # a val task has one seed, before and after training alike
