"""The base model's test figures, evaluated once and shared by every seed of an example.

Every seed starts from the same base model, evaluated greedily on the same test tasks
with the same response cap, so its "before" is one evaluation, kept in
``results/base/test.json`` (the file ``evaluate.py --out`` writes), not one per run.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE_FILE = "results/base/test.json"
"""Where an example keeps its shared base figures, relative to the example's folder."""


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


def add_before_argument(parser: argparse.ArgumentParser) -> None:
    """A ``train.py``'s ``--before`` option: the shared base figures, or an evaluation in the run."""
    parser.add_argument(
        "--before",
        choices=["shared", "run"],
        default="shared",
        help=f"shared: the base model's test figures from {BASE_FILE} (evaluated once, then reused by every "
        "seed); run: evaluate the base in this run (always with --model or --eval-limit)",
    )


def shared_before(
    args: argparse.Namespace,
    config: dict[str, Any],
    test: list[dict],
    run_split: Callable[..., dict[str, Any]],
    workdir: Path,
) -> dict[str, Any] | None:
    """The base figures a ``train.py`` run shares, or None when it evaluates its own.

    Shared with ``--before shared`` on the bundled model and the whole test split:
    ``run_split`` (the example's) evaluates them once, in ``workdir``, into
    ``<args.results>/base/test.json``, and the trainer's evaluation before the first
    step is switched off in ``config``.
    """
    if args.before != "shared" or args.model is not None or args.eval_limit is not None:
        return None
    from agl_verl.models import smollm2_dir

    cap = args.max_response_tokens
    before = shared_base(
        args.results / "base" / "test.json",
        lambda: run_split(test, model_path=smollm2_dir(), workdir=workdir, max_response_tokens=cap),
        n=len(test),
        split="test",
        max_response_tokens=cap,
    )
    config["val_before"] = False
    return before
