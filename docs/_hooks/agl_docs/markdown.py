"""Small Markdown helpers shared by the reference generators."""

from __future__ import annotations

import re
import textwrap

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?([^`]+)`")
_DOUBLE_TICKS = re.compile(r"``([^`]+)``")


def code(text: str) -> str:
    """``text`` as an inline code span (a Markdown table leaves pipes inside one alone)."""
    text = str(text).replace("\n", " ")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str | None) -> str:
    """Prose for a Markdown table cell: one line, pipes escaped, reST markup as Markdown."""
    if not text:
        return ""
    return inline(" ".join(str(text).split())).replace("|", "\\|")


def inline(text: str) -> str:
    """reST inline markup the docstrings use (``x``, :class:`~a.B`) as Markdown code spans."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return _DOUBLE_TICKS.sub(lambda m: f"`{m.group(1)}`", text)


_CODE_BLOCK = re.compile(r"^(?P<indent>\s*)\.\. code-block::\s*(?P<lang>\w*)\s*$")
_DOCTEST = (">>> ", "... ")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block(lines: list[str], i: int, base: int) -> tuple[list[str], int]:
    """The lines from ``i`` on indented deeper than ``base`` (blank ones inside included), and where they end."""
    block: list[str] = []
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        block.append(lines[i])
        i += 1
    while block and not block[-1].strip():
        block.pop()
        i -= 1
    return block, i


def _fence(lang: str, block: list[str], indent: str) -> list[str]:
    body = textwrap.dedent("\n".join(block)).strip("\n").splitlines()
    return ["", f"{indent}```{lang}", *(f"{indent}{b}" if b else "" for b in body), f"{indent}```"]


def docstring(text: str | None) -> str:
    """A reST-flavoured docstring as Markdown: inline markup as code spans, and each literal block
    (after a line ending in ``::`` or a ``.. code-block::`` directive) and each run of ``>>>`` lines
    as a fenced block. Google-style sections (``Args:``...) are left as they are."""
    if not text:
        return ""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = line[: _indent(line)]
        directive = _CODE_BLOCK.match(line)
        if directive or line.rstrip().endswith("::"):
            if not directive:
                text_before = line.rstrip()[:-1]
                out.append(inline(text_before) if text_before.strip() != ":" else "")
            block, i = _block(lines, i + 1, _indent(line))
            out += _fence(directive["lang"] or "python" if directive else "python", block, indent)[
                bool(out and not out[-1]) :
            ]
        elif line.lstrip().startswith(_DOCTEST[0]):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith(_DOCTEST):
                block.append(lines[i].lstrip()[4:])
                i += 1
            out += _fence("python", block, indent)[bool(out and not out[-1]) :]
        else:
            out.append(inline(line))
            i += 1
    return "\n".join(out).strip() + "\n"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; cells must already be escaped (see :func:`cell`, :func:`code`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
