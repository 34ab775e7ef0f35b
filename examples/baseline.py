"""The base model's test figures, evaluated once and shared by every seed of an example.

Every seed starts from the same base model, evaluated greedily on the same test tasks
with the same response cap, so its "before" is one evaluation, kept in
``results/base/test.json`` (the file ``evaluate.py --out`` writes), not one per run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def shared_base(path: Path, evaluate: Callable[[], dict[str, Any]], **facts: Any) -> dict[str, Any]:
    """The summary saved in ``path`` if it records every one of ``facts``; else ``evaluate()``'s, saved there.

    ``facts`` say what the evaluation was (``n``, ``split``, ``max_response_tokens``): a
    file made for other tasks or another cap is evaluated again and replaced.
    """
    if path.exists():
        saved = json.loads(path.read_text())
        if all(saved.get(key) == value for key, value in facts.items()):
            return saved
    started = time.monotonic()
    summary = evaluate()
    summary.update(facts)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return summary
