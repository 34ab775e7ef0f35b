"""examples/prompt_optimization.py builds each arm's config from the example's own (no model runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_apo.settings import parse_settings
from agl_trainer.config import parse_config
from examples import prompt_optimization as po


@pytest.mark.parametrize("agent", ["calc", "sql"])
@pytest.mark.parametrize("arm", ["demos", "textual", "both"])
def test_each_arm_is_the_examples_run_with_the_apo_backend(agent, arm, tmp_path):
    import importlib

    spec = importlib.import_module(f"{po.AGENTS[agent]}.spec").SPEC
    args = po.parser().parse_args(["--agent", agent, "--arm", arm, "--seed", "2", "--val-limit", "5"])
    config = po.run_config(args, spec, tmp_path, Path("/models/smollm2"))
    parsed = parse_config(config)  # a valid trainer config
    settings = parse_settings(config["backend"]["config"])
    assert parsed.backend.name == "apo" and settings.methods == po.ARMS[arm] and settings.seed == 2
    assert parsed.engine.name == "transformers" and parsed.engine.config["model_path"] == "/models/smollm2"
    assert parsed.val_before is False and parsed.val_max_tasks == 5 and parsed.val_temperature == 0.0
    resources, rewritten = po.starting_resources(agent)
    assert parsed.resources == resources and settings.resource == rewritten and rewritten in resources
    if arm == "demos":
        assert settings.optimizer is None
    else:  # SmolLM2 is its own optimizer unless another model is named
        assert settings.optimizer.engine and settings.optimizer.base_url is None
    if agent == "sql":  # the writer's calls only, each with the episode's reward
        assert (
            parsed.transitions.agents == ["write_query", "rewrite_query"] and parsed.transitions.credit == "broadcast"
        )


def test_a_named_optimizer_replaces_the_engine(tmp_path):
    from examples.calc_agent.spec import SPEC

    argv = ["--agent", "calc", "--arm", "textual", "--optimizer-url", "https://api.example/v1"]
    args = po.parser().parse_args([*argv, "--optimizer-model", "big", "--optimizer-key-env", "EXAMPLE_KEY"])
    optimizer = po.run_config(args, SPEC, tmp_path, Path("/m"))["backend"]["config"]["optimizer"]
    assert optimizer == {"base_url": "https://api.example/v1", "model": "big", "api_key_env": "EXAMPLE_KEY"}


def test_the_report_has_a_row_per_results_file(tmp_path, capsys):
    import json

    step = {"apo/optimizer_calls": 2.0, "apo/optimizer_unfenced": 1.0, "apo/optimizer_discarded": 1.0}
    for arm, seed, after in (("both", 1, 0.25), ("demos", 0, 0.125)):
        record = {"arm": arm, "seed": seed, "before": {"success": 0.1}, "after": {"success": after}, "steps": 2}
        record["eval_tasks"] = 6
        record |= {"val_batch_score": 0.5, "resources_version": f"s3c{seed}-ab", "by_step": [step, step]}
        (tmp_path / f"apo-{arm}-seed{seed}.json").write_text(json.dumps(record))
    (tmp_path / "calc_agent-seed0.json").write_text("{}")  # an RL arm's file: not this table's
    assert po.main(["--agent", "calc", "--report", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:4] == [  # per arm, in the arms' order: mean ± std (one seed each here), then every seed
        "| demos | 0 | 2 | 6 | 10.0 | 12.5 (12.5) | 1 of 1 |",
        "| both | 1 | 2 | 6 | 10.0 | 25.0 (25.0) | 1 of 1 |",
    ]
    assert lines[7:] == [
        "| both | 1 | 0.100 | 0.250 | 0.500 | s3c1-ab | 4 (0, 2, 2) |",
        "| demos | 0 | 0.100 | 0.125 | 0.500 | s3c0-ab | 4 (0, 2, 2) |",
    ]
