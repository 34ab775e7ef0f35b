"""The documentation's code blocks: each is run by the test suite or says why it is not.

The rules (every page under ``docs/`` and README.md obeys them; ``tests/docs`` applies them):

- On the line directly before a block's opening fence, a marker may say what to do with it:
  ``<!-- run -->``, ``<!-- run: config -->`` or ``<!-- not run: REASON -->`` (REASON not empty).
- ``python`` blocks run unless marked ``not run``: all of one page's, in page order, as one
  script in a fresh subprocess (cwd a fresh temporary directory, the repository's packages
  importable, every ``AGL_*`` variable cleared), with a timeout.
- ``bash``, ``sh``, ``shell`` and ``console`` blocks run only when marked ``<!-- run -->``:
  each command, in the repository root, with the virtual environment's ``bin`` first on PATH
  and the ``AGL_*`` variables cleared. A command is a line (a leading ``$ `` is dropped; a line
  ending in ``\\`` continues on the next); in a ``console`` block only the ``$ `` lines are
  commands, the others are their output. Blank lines and ``#`` comments are skipped.
- ``yaml`` blocks marked ``<!-- run: config -->`` are validated as an ``agl train`` config
  (:func:`agl_trainer.config.parse_config`).
- Every other block (another language, none, or one of the above without its marker) needs
  ``<!-- not run: REASON -->``. A marker that is not directly before a fence is an error too.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PYTHON = frozenset({"python", "py", "python3"})
SHELL = frozenset({"bash", "sh", "shell", "console"})
YAML = frozenset({"yaml", "yml"})

PYTHON_TIMEOUT_S = 300.0
"""How long one page's Python script may run."""
COMMAND_TIMEOUT_S = 120.0
"""How long one shell command may run."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
_MARKER = re.compile(r"^[ \t]*<!--[ \t]*(?P<body>(?:not )?run\b.*?)[ \t]*-->[ \t]*$")


class SnippetError(AssertionError):
    """A page breaks the rules or one of its blocks failed; the message names ``file:line``."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    where: str
    """``file:line`` of its opening fence (the file relative to the repository root)."""
    line: int
    """The line of its opening fence (1-based)."""
    lang: str
    """The first word of the info string, lower case (``""`` for none)."""
    code: str
    """Its text, dedented by the fence's indentation."""
    marker: str | None
    """The marker on the line before the fence (``run``, ``run: config``, ``not run: ...``), if any."""


@dataclass
class Plan:
    """What the rules make of a page's blocks."""

    python: list[Block] = field(default_factory=list)
    shell: list[Block] = field(default_factory=list)
    config: list[Block] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(file:line, reason)`` of each block marked ``not run``."""
    problems: list[str] = field(default_factory=list)
    """``file:line: what is wrong`` for each block (or marker) the rules reject."""


@dataclass
class PageReport:
    """What running a page did."""

    ran: list[str]
    """``file:line`` of each block that ran (or, for a config, was validated)."""
    skipped: list[tuple[str, str]]
    """``(file:line, reason)`` of each block marked ``not run``."""


def language(info: str) -> str:
    """The block's language from its info string: ``python title="x"`` and ``{.python}`` are ``python``."""
    first = info.split()[0] if info.split() else ""
    return first.strip("{}").lstrip(".").lower()


def blocks(text: str, name: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of Markdown ``text`` (``name`` is the file, for ``file:line``), and the
    problems found while reading them (a marker not followed by a fence, an unclosed fence)."""
    lines = text.splitlines()
    found: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        marker = _MARKER.match(lines[i])
        if marker and not (i + 1 < len(lines) and _FENCE.match(lines[i + 1])):
            problems.append(f"{name}:{i + 1}: marker <!-- {marker['body']} --> is not directly before a code block")
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        before = _MARKER.match(lines[i - 1]) if i > 0 else None
        end = i + 1
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if end == len(lines):
            problems.append(f"{name}:{i + 1}: code block is never closed")
        body = [line[indent:] if line[:indent].strip() == "" else line.lstrip() for line in lines[i + 1 : end]]
        found.append(
            Block(f"{name}:{i + 1}", i + 1, language(opening["info"]), "\n".join(body), before and before["body"])
        )
        i = end + 1
    return found, problems


def plan(text: str, name: str) -> Plan:
    """Sort a page's blocks by the rules: what runs, what is skipped and why, what breaks them."""
    found, problems = blocks(text, name)
    out = Plan(problems=problems)
    for block in found:
        marker = block.marker
        if marker is not None and marker.startswith("not run"):
            reason = marker.partition(":")[2].strip()
            if not marker.startswith("not run:") or not reason:
                out.problems.append(f"{block.where}: <!-- not run: REASON --> needs a reason")
            else:
                out.skipped.append((block.where, reason))
        elif block.lang in PYTHON and marker in (None, "run"):
            out.python.append(block)
        elif block.lang in SHELL and marker == "run":
            out.shell.append(block)
        elif block.lang in YAML and marker == "run: config":
            out.config.append(block)
        elif marker is not None:
            out.problems.append(f"{block.where}: <!-- {marker} --> does not apply to a {block.lang or 'plain'} block")
        else:
            expected = {**dict.fromkeys(SHELL, "<!-- run --> or "), **dict.fromkeys(YAML, "<!-- run: config --> or ")}
            out.problems.append(
                f"{block.where}: a {block.lang or 'plain'} block needs "
                f"{expected.get(block.lang, '')}<!-- not run: REASON --> on the line before its fence"
            )
    return out


def clean_env(root: Path) -> dict[str, str]:
    """This process's environment without ``AGL_*``, the venv's ``bin`` first on PATH and the
    repository root importable (after whatever PYTHONPATH already names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), str(root)] if p)
    return env


def run_python(python: list[Block], root: Path, timeout_s: float = PYTHON_TIMEOUT_S, cwd: Path | None = None) -> str:
    """Run a page's Python blocks as one script; its standard output. A failure names the
    ``file:line`` it happened at. ``cwd``: where it runs (default: a temporary directory, removed)."""
    if not python:
        return ""
    script: list[str] = []
    starts: list[tuple[int, Block]] = []
    for block in python:
        script.append(f"# --- {block.where}")
        starts.append((len(script) + 1, block))
        script.extend(block.code.splitlines())
    with contextlib.ExitStack() as stack:
        here = cwd if cwd is not None else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agl-docs-")))
        path = here / "page_snippets.py"
        path.write_text("\n".join(script) + "\n")
        try:
            done = subprocess.run(
                [sys.executable, str(path)],
                cwd=here,
                env=clean_env(root),
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise SnippetError(f"{python[0].where}: the page's python blocks ran past {timeout_s:.0f} s") from None
    if done.returncode != 0:
        lines = [int(n) for n in re.findall(rf'File "{re.escape(str(path))}", line (\d+)', done.stderr)]
        where = python[0].where
        if lines:
            start, block = max((s for s in starts if s[0] <= lines[-1]), key=lambda s: s[0])
            where = f"{block.where.rsplit(':', 1)[0]}:{block.line + lines[-1] - start + 1}"
        raise SnippetError(f"{where}: python block failed (exit {done.returncode}):\n{_tail(done.stderr)}")
    return done.stdout


def commands(block: Block) -> list[str]:
    """The commands of a shell block (see the module's rules)."""
    out: list[str] = []
    pending = ""
    for raw in block.code.splitlines():
        line = raw.rstrip()
        if not pending:
            if block.lang == "console" and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ").strip()
            if not line or line.startswith("#"):
                continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        out.append(pending + line.strip())
        pending = ""
    if pending:
        out.append(pending.strip())
    return out


def run_shell(block: Block, root: Path, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
    """Run each command of a ``<!-- run -->`` shell block in ``root``; the first failure is an error."""
    for command in commands(block):
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=root,
                env=clean_env(root),
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise SnippetError(f"{block.where}: `{command}` ran past {timeout_s:.0f} s") from None
        if done.returncode != 0:
            raise SnippetError(
                f"{block.where}: `{command}` exited {done.returncode}:\n{_tail(done.stderr or done.stdout)}"
            )


def check_config(block: Block) -> None:
    """Validate a ``<!-- run: config -->`` YAML block as a trainer config."""
    import yaml

    from agl.errors import ConfigError
    from agl_trainer.config import parse_config

    try:
        data = yaml.safe_load(block.code)
    except yaml.YAMLError as exc:
        raise SnippetError(f"{block.where}: not YAML: {exc}") from None
    try:
        parse_config(data if data is not None else {}, source=block.where)
    except ConfigError as exc:
        raise SnippetError(str(exc)) from None


def run_page(path: Path, root: Path) -> PageReport:
    """Apply the rules to the page at ``path``: every problem at once, else run what runs."""
    path, root = path.resolve(), root.resolve()
    name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    page = plan(path.read_text(), name)
    if page.problems:
        raise SnippetError("\n".join(page.problems))
    run_python(page.python, root)
    for block in page.shell:
        run_shell(block, root)
    for block in page.config:
        check_config(block)
    ran = sorted(page.python + page.shell + page.config, key=lambda b: b.line)
    return PageReport(ran=[b.where for b in ran], skipped=page.skipped)


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
