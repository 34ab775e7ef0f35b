"""Build the results page's tables: test results from ``results/calc_agent*-seed*.json`` (written by train.py),
and the learning rate's choice on validation from ``results/lr-choice/``.

    python -m examples.calc_agent.report [--results DIR] [--page FILE] [--check]

Rewrites what lies between ``<!-- results:start -->`` and ``<!-- results:end -->`` in
docs/results/calc-agent.md, and between ``<!-- lr-choice:start -->`` and ``<!-- lr-choice:end -->``;
``--check`` only prints the tables. One row per seed, then mean ± sample standard
deviation over the seeds.

Runs with a validation curve (``train.py --val-every``) have a table of their own in the
results block, an arm per results name (``calc_agent-steps60``): test success before and
after, overall and per operation count, and their validation at the first and last
evaluation. The curves of all seeds of such an arm are drawn into
``results/curves/<arm>.png`` (not with ``--check``), which the block shows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from examples.reporting import (
    DOCS_RESULTS,
    RESULTS,
    curve_link,
    draw_arm_curves,
    half_mean,
    has_curve,
    load_arms,
    pm,
    report_main,
    seed_rows,
    seed_table,
    table_head,
)

from .config import LR, STEPS

HERE = Path(__file__).resolve().parent
PAGE = DOCS_RESULTS / "calc-agent.md"
"""The results page this report writes into."""

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
    "step s",
    "wall min",
)


def skips(record: dict) -> bool:
    """Whether the run took no optimizer step on steps without signal."""
    return record.get("steps_without_signal", "step") == "skip"


def arm_label(record: dict) -> str:
    """The first column: the run's lr, ``skip`` when it :func:`skips`, its staleness bound when
    asynchronous, and the share graded when it trained on recorded traffic (production.py)."""
    label = f"{record['lr']:g}, skip" if skips(record) else f"{record['lr']:g}"
    if record.get("max_staleness"):
        label += f", async k={record['max_staleness']}"
    if "graded" in record:
        label += f", recorded traffic {record['graded']:.0%} graded"
    if record["steps"] != STEPS:
        label += f", {record['steps']} steps"
    return label


def arm_order(record: dict) -> tuple:
    """On-policy lockstep runs first (the config's lr first, then the others from the highest; at one
    lr, ``skip`` after), then asynchronous ones, then those on recorded traffic, most graded first."""
    graded = record.get("graded")
    return (
        graded is not None,
        record.get("max_staleness", 0),
        record["lr"] != LR,
        -record["lr"],
        skips(record),
        -(graded or 0),
    )


def load(results: Path) -> dict[str, list[dict]]:
    """The result records (``<arm>-seed<N>.json``) by arm, in :func:`arm_order`, each in seed order."""
    return load_arms(results, "calc_agent*-seed*.json", arm_label, arm_order)


def load_curves(results: Path) -> dict[str, list[dict]]:
    """The records of runs with a validation curve, by their results name (``calc_agent-steps60``)."""
    arms = load_arms(results, "calc_agent*-seed*.json", lambda r: r["name"], arm_order)
    arms = {name: [r for r in records if has_curve(r)] for name, records in arms.items()}
    return {name: records for name, records in arms.items() if records}


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
        pm([r.get("step_s_mean") for r in records], 1, 0),
        pm([r["wall_s"] for r in records], 1 / 60),
    ]


def render(runs: dict[str, list[dict]]) -> str:
    """The block that goes between the markers: a row per seed, and mean ± std per arm (runs without a curve)."""
    runs = {label: kept for label, records in runs.items() if (kept := [r for r in records if not has_curve(r)])}
    return seed_table(
        runs.items(),
        lambda first: (
            f"Test split ({first['eval_problems']} problems, greedy), before and after "
            f"{first['steps']} steps of {first['batch_size']} problems x {first['n_rollouts']} rollouts:"
        ),
        "lr (skip: no optimizer step without signal; async: rollouts up to k steps ahead; recorded traffic)",
        COLUMNS,
        cells,
    )


CURVE_COLUMNS = (
    "steps",
    "test success before (%)",
    "after (%)",
    "2 operations before (%)",
    "after (%)",
    "3 operations before (%)",
    "after (%)",
    "4 operations before (%)",
    "after (%)",
    "val success at the first evaluation (%)",
    "at the last (%)",
    "step s",
    "wall min",
)


def curve_cells(records: list[dict]) -> list[str]:
    """A row of the curves table over ``records`` (one seed's, or all of them for the mean ± std row)."""

    def operations(when: str, n: int) -> str:
        return pm([r[when]["success_by_operations"].get(str(n)) for r in records], 100)

    steps = sorted({r["steps"] for r in records})
    return [
        ", ".join(str(s) for s in steps),
        pm([r["before"]["success"] for r in records], 100),
        pm([r["after"]["success"] for r in records], 100),
        *(operations(when, n) for n in (2, 3, 4) for when in ("before", "after")),
        pm([r["val_curve"][0]["success_rate"] for r in records], 100),
        pm([r["val_curve"][-1]["success_rate"] for r in records], 100),
        pm([r.get("step_s_mean") for r in records], 1, 0),
        pm([r["wall_s"] for r in records], 1 / 60),
    ]


def render_curves(arms: dict[str, list[dict]], results: Path) -> str:
    """The runs with a validation curve: a row per seed and mean ± std per arm, then each arm's curves."""
    if not arms:
        return ""
    first = next(iter(arms.values()))[0]
    lines = [
        f"Runs with a validation curve (the first {first.get('val_problems', '?')} val problems, greedy, every "
        f"{first.get('val_every', '?')} steps), test split ({first['eval_problems']} problems, greedy) before and "
        f"after, by operations; {first['batch_size']} problems x {first['n_rollouts']} rollouts a step:",
        "",
        *table_head("arm (lr; async: rollouts up to k steps ahead)", CURVE_COLUMNS),
    ]
    for name, records in arms.items():
        lines += seed_rows(f"{name} ({arm_label(records[0])})", records, curve_cells)
    for name in arms:
        lines += ["", curve_link(name)]
    return "\n".join(lines)


def render_results(results: Path) -> str:
    """The results block: the runs without a curve, then those with one (when any)."""
    curves = render_curves(load_curves(results), results)
    return render(load(results)) + (f"\n\n{curves}" if curves else "")


LR_CHOICE = "lr-choice"
"""The folder under ``results/`` and the results page's block of the learning rate's choice on validation."""
VAL_COLUMNS = ("val success (%)", "2 operations (%)", "tool-call validity (%)")


def val_cells(summaries: list[dict]) -> list[str]:
    """A row of the validation table over ``summaries`` (``evaluate.py --split val`` outputs)."""
    return [
        pm([s["success"] for s in summaries], 100),
        pm([s["success_by_operations"].get("2") for s in summaries], 100),
        pm([s["tool_call_validity"] for s in summaries], 100),
    ]


def render_lr_choice(folder: Path) -> str:
    """The validation table: the base model, then each lr's seeds and their mean ± std.

    ``folder`` holds the runs' records (``<arm>-seed<N>.json``, from ``train.py --results``)
    and, beside each, ``val-<arm>-seed<N>.json``, its adapter evaluated greedily on val;
    ``val-base.json`` is the base model on val.
    """
    runs = load_arms(folder, "calc_agent*-seed*.json", arm_label, arm_order)
    if not runs:
        return "No validation run yet (see above)."

    def val_file(record: dict) -> Path:
        return folder / f"val-{record['name']}-seed{record['seed']}.json"

    lines = table_head("lr", VAL_COLUMNS)
    base = folder / "val-base.json"
    if base.exists():
        lines.append("| base model | | " + " | ".join(val_cells([json.loads(base.read_text())])) + " |")
    evaluated = {
        (r["name"], r["seed"]): json.loads(val_file(r).read_text())
        for records in runs.values()
        for r in records
        if val_file(r).exists()
    }

    def cells(records: list[dict]) -> list[str]:
        return val_cells([evaluated[r["name"], r["seed"]] for r in records])

    for label, records in runs.items():
        lines += seed_rows(label, [r for r in records if (r["name"], r["seed"]) in evaluated], cells)
    pending = [val_file(r).name for rs in runs.values() for r in rs if (r["name"], r["seed"]) not in evaluated]
    if pending:
        lines += ["", "Trained, not yet evaluated on val (no " + ", ".join(pending) + ")."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the tables and write them into the results page."""
    return report_main(
        argv,
        __doc__,
        HERE,
        lambda results: {RESULTS: render_results(results), LR_CHOICE: render_lr_choice(results / LR_CHOICE)},
        lambda results: draw_arm_curves(load_curves(results), results),
        page=PAGE,
    )


if __name__ == "__main__":
    sys.exit(main())
