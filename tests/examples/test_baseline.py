"""The shared base evaluation (examples/baseline.py): evaluated once, reused only for the same evaluation."""

from __future__ import annotations

import json
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_the_base_is_evaluated_once_and_evaluated_again_for_another_cap(tmp_path):
    from examples.baseline import shared_base

    runs = []

    def evaluate():
        runs.append(1)
        return {"n": 20, "f1": 0.25 * len(runs)}

    path = tmp_path / "base" / "test.json"
    first = shared_base(path, evaluate, n=20, split="test", max_response_tokens=96)
    again = shared_base(path, evaluate, n=20, split="test", max_response_tokens=96)

    assert len(runs) == 1 and first == again == json.loads(path.read_text())
    assert (first["f1"], first["split"], first["max_response_tokens"]) == (0.25, "test", 96)
    assert first["wall_s"] >= 0
    other_cap = shared_base(path, evaluate, n=20, split="test", max_response_tokens=48)
    assert len(runs) == 2 and other_cap["f1"] == 0.5 and json.loads(path.read_text())["max_response_tokens"] == 48


def test_a_run_shares_the_base_only_on_the_bundled_model_and_the_whole_test_split(tmp_path):
    import argparse

    from examples.baseline import add_before_argument, shared_before

    parser = argparse.ArgumentParser()
    add_before_argument(parser)
    test = [{"task_id": "t0"}, {"task_id": "t1"}]
    calls = []

    def run_split(items, *, model_path, workdir, max_response_tokens):
        calls.append((len(items), workdir, max_response_tokens))
        return {"n": len(items), "f1": 0.5}

    def run(*argv, **options):
        args = parser.parse_args(argv)
        defaults = {"results": tmp_path / "results", "model": None, "eval_limit": None, "max_response_tokens": 96}
        vars(args).update({**defaults, **options})
        config = {}
        return shared_before(args, config, test, run_split, tmp_path / "base-test"), config

    assert run("--before", "run") == (None, {})
    assert run(model=tmp_path / "other-model") == (None, {})
    assert run(eval_limit=1) == (None, {})
    assert calls == []
    before, config = run()
    again, _ = run()
    assert before == again and (before["n"], before["f1"], before["max_response_tokens"]) == (2, 0.5, 96)
    assert config == {"val_before": False} and calls == [(2, tmp_path / "base-test", 96)]
