"""``make train`` says where its store is, and README's dashboard example opens that store."""

from __future__ import annotations

from pathlib import Path

from examples.first_digit.train import store_line

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
