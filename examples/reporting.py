"""What the examples' ``report.py`` scripts share: results by arm, ``mean ± std`` cells and the results page's blocks.

Each example's report builds its own tables from its ``results/*.json`` and writes each
between the markers of its block in its page of the documentation's results section
(``docs/results/<example>.md``, :data:`DOCS_RESULTS`): ``<!-- results:start -->`` and
``<!-- results:end -->`` for the results table, ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` for another block named NAME.

Runs trained with ``--val-every`` hold a validation curve (``val_curve``: ``{step,
success_rate}`` points); :func:`draw_curves` draws the curves of all seeds of such an arm in
one PNG, ``results/curves/<arm>.png`` (:data:`CURVES`), beside the results files. The site
serves only what lies under ``docs/``, so the report copies each PNG it draws next to the
page, into ``img/`` (:data:`IMAGES`), and the page's image links point there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS = "results"
"""The name of the block that holds an example's results table."""
CURVES = "curves"
"""The folder under ``results/`` that holds the arms' validation-curve PNGs."""
IMAGES = "img"
"""The folder beside a results page that holds the copies of the PNGs it shows."""
DOCS_RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
"""The documentation's results section: each example's report writes into its page there."""


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of the page's block called ``name``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


START, END = markers(RESULTS)


def pm(values: list[float | None], scale: float = 1.0, digits: int = 1) -> str:
    """``mean ± std`` (sample std) of the values that are there (``n/a`` if none; no ± for one)."""
    values = [v * scale for v in values if v is not None]
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def load_arms(
    results: Path, pattern: str, arm: Callable[[dict], str], order: Callable[[dict], Any]
) -> dict[str, list[dict]]:
    """The result records in ``results`` matching ``pattern``, by ``arm(record)``, each arm in seed order.

    The arms are sorted by ``order`` of their first record.
    """
    runs: dict[str, list[dict]] = {}
    for path in sorted(results.glob(pattern)):
        record = json.loads(path.read_text())
        runs.setdefault(arm(record), []).append(record)
    ordered = sorted(runs.items(), key=lambda item: order(item[1][0]))
    return {name: sorted(records, key=lambda r: r["seed"]) for name, records in ordered}


def seed_rows(label: str, records: list[dict], cells: Callable[[list[dict]], list[str]]) -> list[str]:
    """An arm's table rows: one per seed, then ``mean ± std`` over them when there are several."""
    rows = [f"| {label} | {r['seed']} | " + " | ".join(cells([r])) + " |" for r in records]
    if len(records) > 1:
        rows.append(f"| {label} | **mean ± std** | " + " | ".join(cells(records)) + " |")
    return rows


def table_head(first_column: str, columns: Sequence[str]) -> list[str]:
    """A table's header and separator rows: ``first_column``, ``seed``, then ``columns``."""
    return [f"| {first_column} | seed | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]


def seed_table(
    arms: Iterable[tuple[str, list[dict]]],
    heading: Callable[[dict], str],
    first_column: str,
    columns: Sequence[str],
    cells: Callable[[list[dict]], list[str]],
) -> str:
    """A results block: ``heading(first record)``, then a table of :func:`seed_rows` per ``(label, records)`` arm."""
    arms = list(arms)
    if not arms:
        return "No trained seed yet: run train.py (see above), then this script."
    lines = [heading(arms[0][1][0]), "", *table_head(first_column, columns)]
    for label, records in arms:
        lines += seed_rows(label, records, cells)
    return "\n".join(lines)


MERGE = "merge"
"""The name of the block that holds what merging did in the arms trained with ``--merge prefix``."""
MERGE_COLUMNS = (
    "calls",
    "merged into the call before",
    "rows trained",
    "learner tokens, one row per call",
    "merged",
    "ratio",
    "update s/step",
    "what broke a merge",
)


def merge_cells(records: list[dict]) -> list[str]:
    """A :func:`merge_table` row's figures over ``records`` (totals over each run's steps)."""
    totals = [r["merge"]["total"] for r in records]
    steps = [len(r["merge"]["by_step"]["rows"]) or 1 for r in records]
    breaks: dict[str, int] = {}
    for r in records:
        for reason, n in r["merge"]["breaks"].items():
            breaks[reason] = breaks.get(reason, 0) + n
    return [
        pm([t["rows"] + t["merged_calls"] for t in totals], 1, 0),
        pm([t["merged_calls"] for t in totals], 1, 0),
        pm([t["rows"] for t in totals], 1, 0),
        pm([t["unmerged_tokens"] for t in totals], 1, 0),
        pm([t["learner_tokens"] for t in totals], 1, 0),
        pm([t["learner_tokens"] / t["unmerged_tokens"] if t["unmerged_tokens"] else None for t in totals], 1, 2),
        pm([t["update_s"] / n for t, n in zip(totals, steps, strict=True)], 1, 1),
        ", ".join(f"{reason} {n}" for reason, n in sorted(breaks.items())) or "none",
    ]


def merge_table(arms: dict[str, list[dict]]) -> str:
    """The merge block: for each arm trained with ``--merge prefix``, what merging did, seed by seed."""
    merged = [(name, records) for name, records in arms.items() if all("merge" in r for r in records)]
    if not merged:
        return "No run with `--merge prefix` yet."
    heading = (
        "What merging did in training (`--merge prefix`), over each run's steps: the calls trained, those that "
        "joined the row of the call before, the learner's tokens as one row per call and as merged, and the "
        "update's seconds a step."
    )
    lines = [heading, "", *table_head("arm", MERGE_COLUMNS)]
    for name, records in merged:
        lines += seed_rows(name, records, merge_cells)
    return "\n".join(lines)


def half_mean(by_step: list[float] | None, half: int) -> float | None:
    """The mean of the first (``half=0``) or second half of a per-step series; None without one."""
    if not by_step:
        return None
    middle = len(by_step) // 2
    part = by_step[:middle] if half == 0 else by_step[middle:]
    return statistics.fmean(part) if part else None


def write_block(page: Path, block: str, name: str = RESULTS) -> None:
    """Replace what lies between the markers of the block ``name`` in ``page`` with ``block``.

    Raises ``ValueError`` naming the file and the markers when either marker is missing.
    """
    start, end = markers(name)
    text = page.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{page}: no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    page.write_text(f"{head}{start}\n{block}\n{end}{tail}")


def report_main(
    argv: list[str] | None,
    description: str,
    here: Path,
    build: Callable[[Path], dict[str, str]],
    draw: Callable[[Path], list[Path]] | None = None,
    *,
    page: Path,
) -> int:
    """A report script's command line: print the blocks ``build(results_dir)`` makes and write them into the page.

    ``build`` returns the page's blocks by name (:data:`RESULTS` for the results table).
    ``draw(results_dir)``, when given, writes the figures the blocks link (the PNGs it
    returns), each then copied into ``img/`` beside the page. ``here`` is the example's
    folder (``results/`` by default); ``page`` its results page (``--page``). ``--check``
    only prints, writing neither figures nor page. Returns the exit status (1, with the page
    left as it was, when it lacks the markers of a block).
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=here / "results")
    parser.add_argument("--page", type=Path, default=page, help=f"the results page to write into (default {page.name})")
    parser.add_argument("--check", action="store_true", help="print only; leave the page alone")
    args = parser.parse_args(argv)
    blocks = build(args.results)
    print("\n\n".join(blocks.values()))
    if args.check:
        return 0
    text = args.page.read_text()
    for figure in draw(args.results) if draw else []:
        print(f"wrote {figure} and {copy_image(figure, args.page)}", file=sys.stderr)
    try:
        for name, block in blocks.items():
            write_block(args.page, block, name)
    except ValueError as exc:
        args.page.write_text(text)
        print(exc, file=sys.stderr)
        return 1
    return 0


def copy_image(figure: Path, page: Path) -> Path:
    """Copy ``figure`` into ``img/`` beside ``page`` (the site serves only ``docs/``); returns the copy."""
    copy = page.parent / IMAGES / figure.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(figure.read_bytes())
    return copy


def has_curve(record: dict) -> bool:
    """Whether the run was evaluated on validation during training (``--val-every``): it has a curve."""
    return bool(record.get("val_curve"))


def curve_png(results: Path, arm: str) -> Path:
    """Where the validation curves of ``arm`` go: ``results/curves/<arm>.png``."""
    return results / CURVES / f"{arm}.png"


def curve_link(arm: str) -> str:
    """The Markdown image of ``arm``'s curves, relative to the results page (its copy in ``img/``)."""
    return f"![validation curves of {arm}]({IMAGES}/{arm}.png)"


def draw_curves(arm: str, records: list[dict], path: Path, *, ylabel: str = "validation success (%)") -> Path:
    """Draw the validation curve of each seed of ``arm`` (``records`` with a ``val_curve``) into one PNG at ``path``.

    One line per seed, and their mean where every seed was evaluated at the same steps. The
    file has no time stamp (the same records draw the same bytes), so re-running the report
    leaves a committed figure unchanged. Raises ``ValueError`` naming the arm when a record
    has no curve.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    missing = [r["seed"] for r in records if not has_curve(r)]
    if missing or not records:
        raise ValueError(f"{arm}: no val_curve in the records of seed(s) {missing or 'any'}")
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    curves = [([p["step"] for p in r["val_curve"]], [100 * p["success_rate"] for p in r["val_curve"]]) for r in records]
    for record, (steps, values) in zip(records, curves, strict=True):
        ax.plot(steps, values, marker="o", markersize=3, linewidth=1, alpha=0.7, label=f"seed {record['seed']}")
    if len(curves) > 1 and all(steps == curves[0][0] for steps, _ in curves):
        mean = [statistics.fmean(column) for column in zip(*(values for _, values in curves), strict=True)]
        ax.plot(curves[0][0], mean, color="black", linewidth=2, label="mean")
    problems = records[0].get("val_problems")
    ax.set_title(f"{arm}: {len(records)} seed(s)" + (f", {problems} validation tasks" if problems else ""))
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def draw_arm_curves(arms: dict[str, list[dict]], results: Path) -> list[Path]:
    """:func:`draw_curves` for each arm that has curves (its seeds without one left out), into ``results/curves/``."""
    drawn = []
    for arm, records in arms.items():
        with_curves = [r for r in records if has_curve(r)]
        if with_curves:
            drawn.append(draw_curves(arm, with_curves, curve_png(results, arm)))
    return drawn
