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


def docstring(text: str | None) -> str:
    """A reST-flavoured docstring as Markdown: inline markup converted, and each
    ``Example::`` paragraph's indented block as a fenced Python block."""
    if not text:
        return ""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(inline(line.rstrip()[:-1]))
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            body = textwrap.dedent("\n".join(block)).strip("\n")
            out += ["", "```python", body, "```", ""]
            continue
        out.append(inline(line))
        i += 1
    return "\n".join(out).strip() + "\n"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; cells must already be escaped (see :func:`cell`, :func:`code`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
