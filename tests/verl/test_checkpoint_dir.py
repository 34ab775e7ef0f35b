"""agl_verl.models.checkpoint_dir: what an evaluation command serves for a --checkpoint path."""

from __future__ import annotations

import pytest

from agl.errors import ConfigError
from agl_verl.models import checkpoint_dir


def test_an_adapter_or_model_directory_is_served_as_it_is(tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert checkpoint_dir(tmp_path / "adapter") == tmp_path / "adapter"
    assert checkpoint_dir(tmp_path / "model") == tmp_path / "model"


def test_a_work_directory_gives_its_highest_published_step(tmp_path):
    for name in ("step-2", "step-10", "step-9", "step-x"):
        (tmp_path / "verl" / "versions" / name).mkdir(parents=True)
    assert checkpoint_dir(tmp_path) == tmp_path / "verl" / "versions" / "step-10"  # by number, not by name


def test_anything_else_is_refused_with_the_path(tmp_path):
    with pytest.raises(ConfigError, match=f"checkpoint: {tmp_path} is neither"):
        checkpoint_dir(tmp_path)


def test_a_policy_gives_its_own_highest_published_step(tmp_path):
    for name in ("writer-step-3", "writer-step-12", "step-20", "checker-step-30", "writer-step-x"):
        (tmp_path / "verl" / "versions" / name).mkdir(parents=True)
    assert checkpoint_dir(tmp_path, policy="writer") == tmp_path / "verl" / "versions" / "writer-step-12"
    assert checkpoint_dir(tmp_path) == tmp_path / "verl" / "versions" / "step-20"
    with pytest.raises(ConfigError, match=r"verl/versions/rewriter-step-N"):
        checkpoint_dir(tmp_path, policy="rewriter")
