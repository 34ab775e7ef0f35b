"""The hook reference, read from the ``@hookspec`` functions of :mod:`agl.hookspecs`."""

from __future__ import annotations

import inspect
import types

from agl_docs.markdown import docstring


def hookspecs(module: types.ModuleType, project: str = "agl") -> list[types.FunctionType]:
    """The functions of ``module`` marked as hook specifications of ``project``, in source order."""
    marker = f"{project}_spec"
    found = [f for f in vars(module).values() if inspect.isfunction(f) and hasattr(f, marker)]
    return sorted(found, key=lambda f: f.__code__.co_firstlineno)


class _Source(str):
    """An annotation kept as source text (``from __future__ import annotations``), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


def _unquoted(annotation: object) -> object:
    return _Source(annotation) if isinstance(annotation, str) else annotation


def signature(fn: types.FunctionType) -> str:
    """``def name(arg: Type, ...) -> Return`` with the annotations as written in the source."""
    sig = inspect.signature(fn)
    sig = sig.replace(
        parameters=[p.replace(annotation=_unquoted(p.annotation)) for p in sig.parameters.values()],
        return_annotation=_unquoted(sig.return_annotation),
    )
    return f"def {fn.__name__}{sig}"


def page(module: types.ModuleType) -> str:
    """The Markdown page: the module's explanation, then every hook with its signature and docstring."""
    specs = hookspecs(module)
    out = [
        "# Plugin hooks",
        "",
        f"Generated from `{module.__name__}` each time the site is built: every hook agl calls,",
        "with its signature and its documentation. Implement one with `@agl.hookimpl` on a",
        "function of the same name (it may take any subset of the arguments, by name).",
        "",
        "| hook | what it is for |",
        "|---|---|",
    ]
    for fn in specs:
        first = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
        out.append(f"| [`{fn.__name__}`](#{fn.__name__}) | {docstring(first).strip()} |")
    out += ["", "## How plugins work", "", docstring(inspect.getdoc(module))]
    for fn in specs:
        out += [f"## `{fn.__name__}`", "", "```python", signature(fn), "```", "", docstring(inspect.getdoc(fn))]
    return "\n".join(out)


def agl_page() -> str:
    """The page for :mod:`agl.hookspecs`."""
    import agl.hookspecs

    return page(agl.hookspecs)
