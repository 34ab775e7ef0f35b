"""The shared base evaluation (examples/baseline.py): evaluated once, reused only for the same evaluation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_the_base_is_evaluated_once_and_evaluated_again_for_another_cap(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from baseline import shared_base

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
    sys.modules.pop("baseline", None)
