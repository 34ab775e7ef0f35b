"""Build the results page's results table from ``results/rag_agent*-seed*.json`` (written by train.py).

    python -m examples.rag_agent.report [--results DIR] [--page FILE] [--check]

Rewrites what lies between ``<!-- results:start -->`` and ``<!-- results:end -->`` in
docs/results/rag-agent.md, and the ``merge`` block (what merging did in the ``--merge prefix``
arms); ``--check`` only prints. One row per seed, then mean ± sample standard deviation over
the seeds, for each arm (what the run trained on).
"""

from __future__ import annotations

import sys
from pathlib import Path

from examples.reporting import (
    DOCS_RESULTS,
    MERGE,
    RESULTS,
    half_mean,
    load_arms,
    merge_table,
    pm,
    report_main,
    seed_table,
)

HERE = Path(__file__).resolve().parent
PAGE = DOCS_RESULTS / "rag-agent.md"
"""The results page this report writes into."""

COLUMNS = (
    "test F1 before",
    "after",
    "one-hop before",
    "one-hop after",
    "two-hop after",
    "exact match before (%)",
    "after (%)",
    "tool-call validity before (%)",
    "after (%)",
    "searches/episode before",
    "after",
    "episodes cut at the cap before",
    "after",
    "training F1, first half of the steps",
    "second half",
    "wall min",
)


def load(results: Path) -> dict[str, list[dict]]:
    """The result records (``<arm>-seed<N>.json``) by arm, the config's (``rag_agent``) first, each in seed order."""
    return load_arms(
        results, "rag_agent*-seed*.json", lambda r: r["name"], lambda r: (r["name"] != "rag_agent", r["name"])
    )


def trained_on(record: dict) -> str:
    """What an arm trained on, in words: ``one-hop, 1 question x 8`` and the like."""
    hops = {(1,): "one-hop", (2,): "two-hop", (1, 2): "all hops"}[tuple(record["train_hops"])]
    questions = "question" if record["batch_size"] == 1 else "questions"
    merged = ", calls merged" if record.get("transitions_config", {}).get("merge") == "prefix" else ""
    return f"{hops}, {record['batch_size']} {questions} x {record['n_rollouts']}{merged}"


def cells(records: list[dict]) -> list[str]:
    """The row's figures over ``records`` (one seed's, or all of them for the mean ± std row)."""

    def column(when: str, key: str, scale: float = 1, digits: int = 3) -> str:
        return pm([r[when].get(key) for r in records], scale, digits)

    def hops(when: str, n: int) -> str:
        return pm([r[when]["f1_by_hops"].get(str(n)) for r in records], 1, 3)

    def cut(when: str) -> str:
        return pm([r[when]["endings"].get("truncated", 0) for r in records], 1, 1)

    return [
        column("before", "f1"),
        column("after", "f1"),
        hops("before", 1),
        hops("after", 1),
        hops("after", 2),
        column("before", "exact_match", 100, 1),
        column("after", "exact_match", 100, 1),
        column("before", "tool_call_validity", 100, 1),
        column("after", "tool_call_validity", 100, 1),
        column("before", "tool_calls_per_episode", 1, 2),
        column("after", "tool_calls_per_episode", 1, 2),
        cut("before"),
        cut("after"),
        pm([half_mean(r.get("train_f1_by_step"), 0) for r in records], 1, 3),
        pm([half_mean(r.get("train_f1_by_step"), 1) for r in records], 1, 3),
        pm([r["wall_s"] for r in records], 1 / 60),
    ]


def render(runs: dict[str, list[dict]]) -> str:
    """The block that goes between the markers: a row per seed, and mean ± std per arm (by :func:`trained_on`)."""
    arms = [(trained_on(records[0]), records) for records in runs.values()]
    heading = (
        "Test split ({eval_questions} questions of both hops, greedy), before and after {steps} steps at "
        "temperature {temperature:g}, lr {lr:g}. The first column says what an arm trained on: which training "
        "questions, and questions a step x rollouts of each."
    )
    return seed_table(arms, lambda first: heading.format(**first), "trained on", COLUMNS, cells)


def main(argv: list[str] | None = None) -> int:
    """Print the table and write it into the results page."""

    def build(results: Path) -> dict[str, str]:
        runs = load(results)
        return {RESULTS: render(runs), MERGE: merge_table(runs)}

    return report_main(argv, __doc__, HERE, build, page=PAGE)


if __name__ == "__main__":
    sys.exit(main())
