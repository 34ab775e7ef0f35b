"""Build the README's results table from ``results/calc_agent-seed*.json`` (written by train.py).

    python examples/calc_agent/report.py [--results DIR] [--readme FILE] [--check]

Rewrites what lies between ``<!-- results:start -->`` and ``<!-- results:end -->`` in
README.md; ``--check`` only prints the table. One row per seed, then mean ± sample
standard deviation over the seeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from reporting import half_mean, load_arms, pm, report_main, seed_rows  # noqa: E402

COLUMNS = (
    "test success before (%)",
    "after (%)",
    "2 operations before (%)",
    "after (%)",
    "3 after (%)",
    "4 after (%)",
    "tool-call validity before (%)",
    "after (%)",
    "tool calls/episode before",
    "after",
    "training success, first half of the steps (%)",
    "second half (%)",
    "validity in training (%)",
    "wall min",
)


def skips(record: dict) -> bool:
    """Whether the run took no optimizer step on steps without signal."""
    return record.get("steps_without_signal", "step") == "skip"


def arm_label(record: dict) -> str:
    """The first column: the run's lr, and ``skip`` when it :func:`skips`."""
    return f"{record['lr']:g}, skip" if skips(record) else f"{record['lr']:g}"


def load(results: Path) -> dict[str, list[dict]]:
    """The result records (``<arm>-seed<N>.json``) by arm, highest lr first, each in seed order."""
    return load_arms(results, "calc_agent*-seed*.json", arm_label, lambda r: (-r["lr"], skips(r)))


def cells(records: list[dict]) -> list[str]:
    """The row's figures over ``records`` (one seed's, or all of them for the mean ± std row)."""

    def column(when: str, key: str, scale: float = 100, digits: int = 1) -> str:
        return pm([r[when].get(key) for r in records], scale, digits)

    def operations(when: str, n: int) -> str:
        return pm([r[when]["success_by_operations"].get(str(n)) for r in records], 100)

    return [
        column("before", "success"),
        column("after", "success"),
        operations("before", 2),
        operations("after", 2),
        operations("after", 3),
        operations("after", 4),
        column("before", "tool_call_validity"),
        column("after", "tool_call_validity"),
        column("before", "tool_calls_per_episode", 1, 2),
        column("after", "tool_calls_per_episode", 1, 2),
        pm([half_mean(r.get("train_success_by_step"), 0) for r in records], 100),
        pm([half_mean(r.get("train_success_by_step"), 1) for r in records], 100),
        pm([r["train_tool_calls"].get("tool_call_validity") for r in records], 100),
        pm([r["wall_s"] for r in records], 1 / 60),
    ]


def render(runs: dict[str, list[dict]]) -> str:
    """The block that goes between the markers: a row per seed, and mean ± std per arm."""
    if not runs:
        return "No trained seed yet: run train.py (see above), then this script."
    first = next(iter(runs.values()))[0]
    lines = [
        f"Test split ({first['eval_problems']} problems, greedy), before and after "
        f"{first['steps']} steps of {first['batch_size']} problems x {first['n_rollouts']} rollouts:",
        "",
        "| lr (skip: no optimizer step without signal) | seed | " + " | ".join(COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    for label, records in runs.items():
        lines += seed_rows(label, records, cells)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table and write it into the README."""
    return report_main(argv, __doc__, HERE, lambda results: render(load(results)))


if __name__ == "__main__":
    sys.exit(main())
