"""The ``agl`` command.

Each module in this package adds its own subcommands through a
``register(subparsers)`` function; the command is assembled from whichever
modules are present, so a part of agl owns its commands next to its code.
Plugins register theirs through the ``agl_register_commands`` hook.

A mistake the user can fix is one line on stderr naming what to fix (exit status 2
for :class:`~agl.errors.AglError`, 1 for anything else); ``--debug`` (or ``-v``)
shows the traceback as well.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import traceback

from agl import env
from agl.errors import AglError, ConfigError


def build_parser() -> argparse.ArgumentParser:
    """The ``agl`` parser: the built-in subcommands, then those plugins register (``agl_register_commands``)."""
    parser = argparse.ArgumentParser(prog="agl", description="Train any LLM agent with reinforcement learning.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages and show tracebacks")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    _plugin_commands(subparsers)
    return parser


def _plugin_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the commands plugins register; a name already taken is a ConfigError naming the plugin."""
    from agl.plugins import registrations

    for name, provided in registrations("command").winners().items():
        if name in subparsers.choices:
            raise ConfigError(
                f"plugin {provided.plugin!r}, hook 'agl_register_commands': command {name!r} is one agl has already"
            )
        provided.factory(subparsers.add_parser(name, help=provided.description or None))


TOKEN_FLAGS = frozenset({"--admin-token", "--runner-token", "--gateway-token", "--store-token", "--engine-token"})
"""Flags whose value is a secret, which may start with ``-`` (``--admin-token -abc`` as well as
``--admin-token=-abc``); one name per credential in every command (see :mod:`agl_trainer.cli._common`)."""


def join_token_values(argv: list[str]) -> list[str]:
    """``argv`` with ``FLAG VALUE`` written ``FLAG=VALUE`` for token flags whose value starts with one ``-``.

    argparse would take ``-abc`` for an unknown option. Arguments after ``--`` (a
    command ``agl run`` starts) are left as they are; a value starting with ``--``
    still needs the ``--admin-token=VALUE`` form.
    """
    joined: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            joined.append(arg)
            joined.extend(args)
            break
        following = None
        if arg in TOKEN_FLAGS:
            following = next(args, None)
            if following is not None and following.startswith("-") and not following.startswith("--"):
                arg, following = f"{arg}={following}", None
        joined.append(arg)
        if following is not None:
            joined.append(following)
    return joined


def main(argv: list[str] | None = None) -> int:
    """Run ``agl`` with ``argv`` (the process's arguments by default); returns the exit status."""
    argv = join_token_values(sys.argv[1:] if argv is None else list(argv))
    debug = bool({"--debug", "-v", "--verbose"} & set(argv[: argv.index("--") if "--" in argv else None]))
    try:
        parser = build_parser()
    except AglError as exc:
        return _fail(exc, debug)
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # httpx and httpcore log every request at INFO: one line per store call, unless asked for with -v.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(level if args.verbose else logging.WARNING)
    env.warn_unknown()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _fail(exc, args.debug or args.verbose)


def _fail(exc: Exception, debug: bool) -> int:
    """Print ``exc`` as one line (with its traceback first when ``debug``); the exit status for it."""
    if debug:
        traceback.print_exception(exc)
    if isinstance(exc, AglError):
        print(f"agl: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    hint = "" if debug else " (agl --debug ... shows the traceback)"
    print(f"agl: error: {type(exc).__name__}: {_one_line(exc)}{hint}", file=sys.stderr)
    return 1


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or "(no message)"


if __name__ == "__main__":
    sys.exit(main())
