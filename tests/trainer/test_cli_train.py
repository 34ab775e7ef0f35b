"""``agl train``'s flags become a TrainerConfig: ``--set`` values are YAML, flags win over the file."""

from __future__ import annotations

import pytest

from agl.errors import ConfigError
from agl_trainer.cli import build_parser
from agl_trainer.cli.train import build_config


def _config(*argv: str):
    return build_config(build_parser().parse_args(["train", *argv]))


def test_set_values_are_typed_as_yaml():
    config = _config(
        "--set",
        "engine_urls=[http://127.0.0.1:1, http://127.0.0.1:2]",
        "--set",
        "val_before=false",
        "--set",
        "rollout.concurrency=3",
        "--set",
        "seed=7",
    )
    assert config.engine_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert config.val_before is False
    assert config.rollout.concurrency == 3
    assert config.seed == 7


def test_flags_override_the_config_file_and_its_set_values(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("steps: 3\nseed: 1\nrollout:\n  concurrency: 2\n")
    config = _config("--config", str(path), "--set", "seed=5", "--steps", "9")
    assert (config.steps, config.seed, config.rollout.concurrency) == (9, 5, 2)


@pytest.mark.parametrize(("item", "named"), [("steps", "steps"), ("rollout.concurency=3", "concurency")])
def test_a_bad_set_item_names_what_is_wrong(item, named):
    with pytest.raises(ConfigError, match=named):
        _config("--set", item)
