"""What the examples' tests share: checking that an ``agl train`` YAML is the run ``train.py`` makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def assert_yaml_is_the_config(yaml_path: Path, made: dict[str, Any], reward_module: str) -> None:
    """``yaml_path`` parses to the same trainer config as ``made`` (``trainer_config(...)``'s dict).

    ``--model`` fills the YAML's model paths, and train.py registers the reward in code and
    gives its store an absolute path, so those are left out; the YAML must name
    ``reward_module`` as its only plugin.
    """
    from agl_trainer.config import load_config, parse_config

    from_yaml = load_config(yaml_path).model_dump()
    from_py = parse_config(made).model_dump()
    for config in (from_yaml, from_py):
        config["backend"]["config"].pop("model_path", None)
        config["engine"]["config"].pop("model_path", None)
        config.pop("store")
    assert from_yaml.pop("plugins") == [reward_module] and from_py.pop("plugins") == []
    assert from_yaml == from_py
