"""The environment-variable reference, read from the registry in :mod:`agl.env`."""

from __future__ import annotations

import types

from agl_docs.markdown import cell, code, table


def page(module: types.ModuleType) -> str:
    """The Markdown page: every variable of ``module.VARIABLES``, then the retired and renamed names."""
    out = [
        "# Environment variables",
        "",
        f"Generated from `{module.__name__}.VARIABLES` each time the site is built: every `AGL_*`",
        "variable agl reads or sets, what it holds, who reads it and what applies when it is unset.",
        "A set `AGL_*` variable that nothing reads but that looks like one of these (a misspelling,",
        "an old name) is warned about when a command starts.",
        "",
        table(
            ["variable", "what it holds", "default (unset)", "read by"],
            [[code(str(v)), cell(v.what), cell(v.default), cell(v.read_by)] for v in module.VARIABLES],
        ),
    ]
    if module.RETIRED:
        out += [
            "## Retired variables",
            "",
            "Nothing reads these any more; a reader that would have read one refuses to start while it is set.",
            "",
            table(["variable", "use instead"], [[code(old), code(str(new))] for old, new in module.RETIRED.items()]),
        ]
    if module.RENAMED:
        out += [
            "## Renamed switches",
            "",
            "Nothing reads the old names; setting one is warned about, naming the present one.",
            "",
            table(["old name", "present name"], [[code(old), code(str(new))] for old, new in module.RENAMED.items()]),
        ]
    return "\n".join(out)


def agl_page() -> str:
    """The page for :mod:`agl.env`."""
    import agl.env

    return page(agl.env)
