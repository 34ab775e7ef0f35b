"""The ``agl`` command reference, walked from the argparse parser the command itself builds."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from agl_docs.markdown import cell, code, table

USAGE_WIDTH = 100


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Every command under ``parser``, depth first: (its full name, its parser, its one-line help)."""
    yield parser.prog, parser, parser.description or ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                for full, subparser, text in commands(sub):
                    yield full, subparser, (text if subparser is not sub else helps.get(name, "") or text)


def usage(parser: argparse.ArgumentParser) -> str:
    """The command's usage line as ``--help`` prints it, at a fixed width."""
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def arguments(parser: argparse.ArgumentParser) -> list[list[str]]:
    """One table row per argument of ``parser`` (help, subcommand and hidden ones left out)."""
    formatter = parser.formatter_class(prog=parser.prog)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or action.dest
        if action.option_strings and action.nargs != 0:
            names += " " + (formatter._format_args(action, action.metavar or action.dest.upper()))
        elif not action.option_strings:
            names = _positional(action)
        rows.append([code(names), _default(action), cell(formatter._expand_help(action) if action.help else "")])
    return rows


def _positional(action: argparse.Action) -> str:
    """A positional argument's name, its choices after it, in brackets when it may be left out."""
    name = str(action.metavar or action.dest)
    if action.choices is not None and action.metavar is None:
        name += " {" + ",".join(map(str, action.choices)) + "}"
    return f"[{name}]" if action.nargs in ("?", "*") else name


def _default(action: argparse.Action) -> str:
    if action.required and action.option_strings:
        return "required"
    if action.default in (None, argparse.SUPPRESS, [], False) or action.nargs == 0:
        return ""
    return code(repr(action.default) if not isinstance(action.default, str) else action.default)


def page(parser: argparse.ArgumentParser, plugin_commands: dict[str, str] | None = None) -> str:
    """The Markdown page: each command with its help, usage and arguments.

    ``plugin_commands`` maps a top-level command to the plugin that registered it (said next to it).
    """
    plugin_commands = plugin_commands or {}
    out = [
        "# Command line: `agl`",
        "",
        "Generated from `agl_trainer.cli.build_parser()` each time the site is built: every command",
        "and flag below is what `agl ... --help` prints, including commands installed plugins register",
        "(through the `agl_register_commands` hook).",
        "",
    ]
    for full, parser_, text in commands(parser):
        top = full.split()[1] if len(full.split()) > 1 else ""
        level = "#" * min(len(full.split()) + 1, 4)
        out += [f"{level} `{full}`", ""]
        if top in plugin_commands and full.split()[1:] == [top]:
            out += [f"*From the plugin `{plugin_commands[top]}`.*", ""]
        if text:
            out += [cell(text), ""]
        if parser_.description and parser_.description != text:
            out += [cell(parser_.description), ""]
        out += ["```text", usage(parser_), "```", ""]
        rows = arguments(parser_)
        if rows:
            out += [table(["argument", "default", "meaning"], rows)]
    return "\n".join(out)


def agl_page() -> str:
    """The page for the installed ``agl`` command (its plugins' commands included)."""
    from agl.plugins import registrations
    from agl_trainer.cli import build_parser

    parser = build_parser()
    plugin_commands = {name: p.plugin for name, p in registrations("command").winners().items()}
    return page(parser, plugin_commands)
