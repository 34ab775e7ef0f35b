"""The ``agl`` command.

Each module in this package adds its own subcommands through a
``register(subparsers)`` function; the command is assembled from whichever
modules are present, so a part of agl owns its commands next to its code.
Plugins add theirs through the ``agl_register_commands`` hook.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from agl.errors import AglError, ConfigError


def build_parser() -> argparse.ArgumentParser:
    """The ``agl`` parser: the built-in subcommands, then those plugins add (``agl_register_commands``)."""
    parser = argparse.ArgumentParser(prog="agl", description="Train any LLM agent with reinforcement learning.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    _plugin_commands(subparsers)
    return parser


def _plugin_commands(subparsers: argparse._SubParsersAction) -> None:
    """Let plugins add subcommands; a name already taken is a ConfigError naming it."""
    from agl.plugins import hook

    try:
        hook().agl_register_commands(subparsers=subparsers)
    except argparse.ArgumentError as exc:
        raise ConfigError(f"agl_register_commands: a plugin's command clashes with one agl has: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """Run ``agl`` with ``argv`` (the process's arguments by default); returns the exit status."""
    try:
        parser = build_parser()
    except AglError as exc:
        print(f"agl: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # httpx and httpcore log every request at INFO: one line per store call, unless asked for with -v.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(level if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except AglError as exc:
        print(f"agl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
