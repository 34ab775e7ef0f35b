"""What the examples' ``report.py`` scripts share: results by arm, ``mean ± std`` cells and the README's blocks.

Each example's report builds its own tables from its ``results/*.json`` and writes each
between the markers of its block in its README: ``<!-- results:start -->`` and
``<!-- results:end -->`` for the results table, ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` for another block named NAME.
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


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of the README block called ``name``."""
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


def half_mean(by_step: list[float] | None, half: int) -> float | None:
    """The mean of the first (``half=0``) or second half of a per-step series; None without one."""
    if not by_step:
        return None
    middle = len(by_step) // 2
    part = by_step[:middle] if half == 0 else by_step[middle:]
    return statistics.fmean(part) if part else None


def write_block(readme: Path, block: str, name: str = RESULTS) -> None:
    """Replace what lies between the markers of the block ``name`` in ``readme`` with ``block``.

    Raises ``ValueError`` naming the file and the markers when either marker is missing.
    """
    start, end = markers(name)
    text = readme.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{readme}: no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{block}\n{end}{tail}")


def report_main(argv: list[str] | None, description: str, here: Path, build: Callable[[Path], dict[str, str]]) -> int:
    """A report script's command line: print the blocks ``build(results_dir)`` makes and write them into the README.

    ``build`` returns the README's blocks by name (:data:`RESULTS` for the results table).
    ``here`` is the example's folder (``results/`` and ``README.md`` by default); ``--check``
    only prints. Returns the exit status (1, with the README left as it was, when it lacks
    the markers of a block).
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=here / "results")
    parser.add_argument("--readme", type=Path, default=here / "README.md")
    parser.add_argument("--check", action="store_true", help="print only; leave the README alone")
    args = parser.parse_args(argv)
    blocks = build(args.results)
    print("\n\n".join(blocks.values()))
    if args.check:
        return 0
    text = args.readme.read_text()
    try:
        for name, block in blocks.items():
            write_block(args.readme, block, name)
    except ValueError as exc:
        args.readme.write_text(text)
        print(exc, file=sys.stderr)
        return 1
    return 0
