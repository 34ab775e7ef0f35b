"""``agl plugins``: what is installed and what each plugin provides."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("plugins", help="list installed plugins and what they provide")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args) -> int:
    from agl.plugins import list_plugins

    rows = list_plugins()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("plugin", "distribution", "provides", "hooks")
    for row in rows:
        provides = "; ".join(f"{k}: {', '.join(v)}" for k, v in row["provides"].items())
        table.add_row(row["name"], row["distribution"], provides, ", ".join(row["hooks"]))
    Console().print(table)
    return 0
