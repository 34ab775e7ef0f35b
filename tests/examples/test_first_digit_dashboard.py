"""The first_digit run on the dashboard: ``make train`` says where its store is, README's
dashboard example opens that store, its rollouts show their agent, and its validation calls
are not called trained (a short real run: SqliteStore, the in-process gateway and runner, the
example's LangChain agent, tests/fake_engine.py as the model, TinyBackend as the backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

import agl
from agl.plugins import unregister
from agl.store.sqlite import SqliteStore
from agl_trainer.dashboard import queries
from agl_trainer.dashboard.rollout import rollout_page
from agl_trainer.trainer import Trainer
from agl_trainer.transitions import TransitionConfig
from examples.first_digit import rewards
from examples.first_digit.agent import AGENT_NAME, first_digit_agent
from examples.first_digit.tasks import make_tasks
from examples.first_digit.train import store_line
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, small_config

ROOT = Path(__file__).resolve().parents[2]
MAKE_TRAIN_STORE = "runs/first-digit-tiny/agl.db"
"""The store ``make train`` (``python -m examples.first_digit.train --fresh`` in the repository) leaves."""


def test_the_run_names_its_store_and_the_dashboard_command_for_it(monkeypatch):
    monkeypatch.chdir(ROOT)
    line = store_line((ROOT / MAKE_TRAIN_STORE).parent)
    assert line.startswith(f"store: {MAKE_TRAIN_STORE}; ")
    assert f"agl dashboard --store sqlite:///{MAKE_TRAIN_STORE} " in line


def test_a_workdir_elsewhere_is_named_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert f"agl dashboard --store sqlite:///{tmp_path / 'run' / 'agl.db'} " in store_line(tmp_path / "run")


def test_readme_opens_the_dashboard_on_the_store_make_train_leaves():
    readme = (ROOT / "README.md").read_text()
    assert f"agl dashboard --store sqlite:///{MAKE_TRAIN_STORE}" in readme


@pytest.fixture
def first_digit_reward():
    agl.register_plugin(rewards, name="first-digit-reward-test")
    yield
    unregister(name="first-digit-reward-test")


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("first_digit_reward")
def test_the_runs_rollouts_show_their_agent_and_validation_calls_are_not_trained(tmp_path):
    with FakeEngine() as engine:
        config = small_config(tmp_path, engine)
        held_out = make_tasks(1, seed=2)
        backend = TinyBackend(tmp_path / "calls.jsonl")
        Trainer(config, backend=backend).fit(first_digit_agent, make_tasks(2, seed=1, exclude=held_out), held_out)
    store = SqliteStore(tmp_path / "agl.db")
    try:
        rows, total = queries.list_rollouts(store, queries.RolloutFilter())
        assert total == len(rows) and {r.mode for r in rows} == {"train", "val"}
        assert [r.agent for r in rows] == [AGENT_NAME] * total
        val = next(r for r in rows if r.mode == "val")
        page = rollout_page(store, val.rollout_id, prefix="/ui", config=TransitionConfig())
        assert '<span class="muted">not trained</span> (a validation rollout): reward' in page
        assert ">trained</span>" not in page
        train = next(r for r in rows if r.mode == "train")
        page = rollout_page(store, train.rollout_id, prefix="/ui", config=TransitionConfig())
        assert '<span class="s-succeeded">trained</span>: reward' in page
    finally:
        store.close()
