"""The ``agl`` command.

Each module in this package adds its own subcommands through a
``register(subparsers)`` function; the command is assembled from whichever
modules are present, so a part of agl owns its commands next to its code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from agl.errors import AglError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agl", description="Train any LLM agent with reinforcement learning.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except AglError as exc:
        print(f"agl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
