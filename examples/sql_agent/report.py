"""Build the results page's results tables from ``results/*.json`` (written by train.py).

    python -m examples.sql_agent.report [--results DIR] [--page FILE] [--check]

Rewrites what lies between ``<!-- results:start -->`` and ``<!-- results:end -->``
in docs/results/sql-agent.md; ``--check`` only prints the tables. Figures are mean ± sample standard
deviation over the seeds of an arm.

Runs with a validation curve (``train.py --val-every``) have a table of their own: test
success before and after, overall and per tier, every seed and mean ± std, and their
validation at the first and last evaluation; the curves of all seeds of an arm are drawn into
``results/curves/<arm>.png`` (not with ``--check``), which the block shows.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from examples.reporting import (
    DOCS_RESULTS,
    RESULTS,
    curve_link,
    draw_arm_curves,
    half_mean,
    has_curve,
    pm,
    report_main,
    seed_rows,
    table_head,
)

HERE = Path(__file__).resolve().parent
PAGE = DOCS_RESULTS / "sql-agent.md"
"""The results page this report writes into."""

ARM_ORDER = ["per-role", "main", "all-agents", "broadcast", "emitted", "emitted-ignored", "last"]
"""The tables' arm order: the three policy arms, then the credit arms."""
ARM_LABELS = {
    "per-role": "writer and rewriter on one trained policy, the checker a frozen policy (the base model)",
    "main": "one shared adapter serves all three; the writer's and the rewriter's calls trained",
    "all-agents": "one shared adapter serves all three; every call trained, the checker's too",
    "broadcast": "as main, credit broadcast: every trained call gets the final reward",
    "emitted": "as main, credit emitted: the writer's call also gets the agent's intermediate reward (its query runs)",
    "emitted-ignored": "failed arm: as emitted, but the intermediate reward was left out (agent_rewards default)",
    "last": "as main, credit last",
}
"""What each arm is, as the checker table says it (an arm not here gets an empty cell)."""


def load(results: Path, *, curves: bool = False) -> dict[str, list[dict]]:
    """The result records, by arm, in seed order (prompt optimization's ``apo-*`` files have a table of their own:
    ``python -m examples.prompt_optimization --agent sql --report``): those without a validation curve,
    or with ``curves`` those with one."""
    arms: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(p for p in results.glob("*.json") if not p.name.startswith("apo-")):
        record = json.loads(path.read_text())
        if has_curve(record) == curves:
            arms[record["arm"]].append(record)
    for records in arms.values():
        records.sort(key=lambda r: r["seed"])
    return dict(sorted(arms.items(), key=lambda kv: (ARM_ORDER + [kv[0]]).index(kv[0])))


def tier(records: list[dict], when: str, name: str) -> str:
    """Test success on one tier, ``before`` or ``after`` training."""
    return pm([r[when]["success_by_tier"].get(name) for r in records], 100)


def training_success(records: list[dict], half: int) -> str:
    """Training rollouts' success over the first (``half=0``) or second half of the steps."""
    return pm([half_mean(r.get("train_success_by_step"), half) for r in records], 100)


def per_agent(records: list[dict], key: str) -> str:
    """``agent count`` pairs of a per-agent count, averaged over the seeds."""
    agents = sorted({a for r in records for a in r.get(key, {})})
    return ", ".join(f"{a} {statistics.fmean(r.get(key, {}).get(a, 0) for r in records):.0f}" for a in agents)


def arm_table(columns: Sequence[str], arms: dict[str, list[dict]], row: Callable[[list[dict]], list[str]]) -> list[str]:
    """A table of a row per arm: the arm's name, then ``row(its records)``; ``columns`` name them all."""
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    return lines + ["| " + " | ".join([arm, *row(records)]) + " |" for arm, records in arms.items()]


MAIN_COLUMNS = (
    "arm", "credit", "trained agents", "seeds", "steps", "test success before (%)", "after (%)", "easy before",
    "easy after", "medium after", "hard after", "training success, first half of the steps (%)", "second half (%)",
    "wall min/seed",
)  # fmt: skip


def main_table(arms: dict[str, list[dict]]) -> list[str]:
    """Test success before and after, overall and per tier, per arm."""

    def row(records: list[dict]) -> list[str]:
        cfg = records[0]["transitions_config"]
        return [
            cfg["credit"],
            ", ".join(cfg.get("agents") or ["all"]),
            ", ".join(str(r["seed"]) for r in records),
            str(records[0]["steps"]),
            pm([r["before"]["success"] for r in records], 100),
            pm([r["after"]["success"] for r in records], 100),
            tier(records, "before", "easy"),
            tier(records, "after", "easy"),
            tier(records, "after", "medium"),
            tier(records, "after", "hard"),
            training_success(records, 0),
            training_success(records, 1),
            pm([r["wall_s"] for r in records], 1 / 60),
        ]

    return arm_table(MAIN_COLUMNS, arms, row)


BEHAVIOUR_COLUMNS = (
    "arm", "rewrites/question before", "after", "checker acceptance before (%)", "after (%)",
    "final query runs before (%)", "after (%)", "writer's query on one line before (%)", "after (%)",
    "training LLM calls per agent (mean/seed)", "trained transitions per agent (mean/seed)",
)  # fmt: skip


def behaviour_table(arms: dict[str, list[dict]]) -> list[str]:
    """Rewrite rounds per question, checker acceptance and calls per agent, before and after."""

    def row(records: list[dict]) -> list[str]:
        cells = []
        for key, scale, digits in (
            ("rewrites_per_question", 1.0, 2),
            ("checker_acceptance", 100, 1),
            ("final_query_runs", 100, 1),
            ("writer_one_line", 100, 1),
        ):
            cells += [pm([r[when].get(key) for r in records], scale, digits) for when in ("before", "after")]
        return cells + [per_agent(records, "train_agent_calls"), per_agent(records, "trained_transitions")]

    return arm_table(BEHAVIOUR_COLUMNS, arms, row)


def seeds_pm(values: list[float | None], scale: float = 100, digits: int = 1) -> str:
    """``mean ± std`` over the seeds, then each seed's value in seed order (``n/a`` where a seed
    lacks it); just ``n/a`` when none has it."""
    shown = pm(values, scale, digits)
    if shown == "n/a" or len(values) < 2:
        return shown
    return f"{shown} ({', '.join('n/a' if v is None else f'{v * scale:.{digits}f}' for v in values)})"


def checker(record: dict, when: str, name: str) -> float | None:
    """A figure of the checker's on the test split (``evaluation.checker_figures``), None in a results
    file written before they were kept; the acceptance is there in every file (``checker_acceptance``,
    verdicts YES over checks, the same count)."""
    summary = record.get(when) or {}
    value = summary.get("checker", {}).get(name)
    return summary.get("checker_acceptance") if value is None and name == "acceptance" else value


CHECKER_COLUMNS = (
    "arm", "setup", "test success after (%)", "checks after", "checker acceptance before (%)", "after (%)",
    "checker right before (%)", "after (%)", "acceptance of right queries after (%)",
    "acceptance of wrong queries after (%)",
)  # fmt: skip


def checker_table(arms: dict[str, list[dict]]) -> list[str]:
    """Per arm, test success and the checker's figures from its recorded calls, mean ± std and per seed."""

    def row(records: list[dict]) -> list[str]:
        def figure(when: str, name: str, scale: float = 100) -> str:
            return seeds_pm([checker(r, when, name) for r in records], scale, 0 if scale == 1 else 1)

        return [
            ARM_LABELS.get(records[0]["arm"].split("-steps")[0], ""),
            seeds_pm([r["after"].get("success") for r in records]),
            figure("after", "checks", 1),
            figure("before", "acceptance"),
            figure("after", "acceptance"),
            figure("before", "accuracy"),
            figure("after", "accuracy"),
            figure("after", "acceptance_of_right"),
            figure("after", "acceptance_of_wrong"),
        ]

    return arm_table(CHECKER_COLUMNS, arms, row)


def solved_table(arms: dict[str, list[dict]]) -> list[str]:
    """Per seed, how many test questions each arm solved after training that the main arm did too."""
    main = {r["seed"]: set(r["after"]["solved"]) for r in arms.get("main", []) if "solved" in r["after"]}
    lines = [
        "| arm | seed | solved by both | only by main | only by the arm |",
        "|---|---|---|---|---|",
    ]
    for arm, records in arms.items():
        for r in records:
            if arm == "main" or r["seed"] not in main or "solved" not in r["after"]:
                continue
            arm_solved, main_solved = set(r["after"]["solved"]), main[r["seed"]]
            both, only_main, only_arm = (
                len(arm_solved & main_solved),
                len(main_solved - arm_solved),
                len(arm_solved - main_solved),
            )
            lines.append(f"| {arm} | {r['seed']} | {both} | {only_main} | {only_arm} |")
    return lines if len(lines) > 2 else []


WHEN = ("before", "after")
CHECKER_INTRO = (
    "The checker on the test split, from its recorded calls (each checked query scored by execution "
    "match; right: its verdict agreed), mean ± std over the seeds, then each seed's value in seed order:"
)


def render(arms: dict[str, list[dict]]) -> str:
    """The block that goes between the markers."""
    if not arms:
        return "No results yet: run train.py (see above), then this script."
    lines = ["Test split (90 questions, greedy), before and after training:", "", *main_table(arms), ""]
    lines += ["Behaviour on the test split, and who was called and trained:", "", *behaviour_table(arms)]
    if any(checker(r, when, "checks") is not None for records in arms.values() for r in records for when in WHEN):
        lines += ["", CHECKER_INTRO, "", *checker_table(arms)]
    solved = solved_table(arms)
    if solved:
        lines += ["", "The test questions solved after training, against the main arm's on the same seed:", "", *solved]
    return "\n".join(lines)


CURVE_COLUMNS = (
    "steps", "test success before (%)", "after (%)", "easy before (%)", "after (%)", "medium before (%)",
    "after (%)", "hard before (%)", "after (%)", "val success at the first evaluation (%)", "at the last (%)",
    "wall min",
)  # fmt: skip


def curve_cells(records: list[dict]) -> list[str]:
    """A row of the curves table over ``records`` (one seed's, or all of them for the mean ± std row)."""
    return [
        ", ".join(str(s) for s in sorted({r["steps"] for r in records})),
        pm([r["before"]["success"] for r in records], 100),
        pm([r["after"]["success"] for r in records], 100),
        *(tier(records, when, name) for name in ("easy", "medium", "hard") for when in WHEN),
        pm([r["val_curve"][0]["success_rate"] for r in records], 100),
        pm([r["val_curve"][-1]["success_rate"] for r in records], 100),
        pm([r["wall_s"] for r in records], 1 / 60),
    ]


def render_curves(arms: dict[str, list[dict]], results: Path) -> str:
    """The runs with a validation curve: a row per seed and mean ± std per arm, then each arm's curves."""
    if not arms:
        return ""
    first = next(iter(arms.values()))[0]
    lines = [
        f"Runs with a validation curve (the first {first.get('val_problems', '?')} val questions, greedy, every "
        f"{first.get('val_every', '?')} steps), test split before and after, by tier:",
        "",
        *table_head("arm", CURVE_COLUMNS),
    ]
    for arm, records in arms.items():
        lines += seed_rows(arm, records, curve_cells)
    for arm in arms:
        lines += ["", curve_link(arm)]
    return "\n".join(lines)


def render_results(results: Path) -> str:
    """The results block: the runs without a curve, then those with one (when any)."""
    curves = render_curves(load(results, curves=True), results)
    return render(load(results)) + (f"\n\n{curves}" if curves else "")


def main(argv: list[str] | None = None) -> int:
    """Print the tables and write them into the results page."""
    return report_main(
        argv,
        __doc__,
        HERE,
        lambda results: {RESULTS: render_results(results)},
        lambda results: draw_arm_curves(load(results, curves=True), results),
        page=PAGE,
    )


if __name__ == "__main__":
    sys.exit(main())
