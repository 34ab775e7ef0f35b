"""Griffe extensions for the API reference.

:class:`FieldDescriptions`: a pydantic field's ``Field(description=...)`` is its docstring.

agl's config and record models document their fields in ``description=`` (it shows in
errors and JSON schemas), so the API reference reads it from there instead of asking for a
second copy as an attribute docstring. An attribute docstring, where one is written, wins.

:class:`RestMarkup`: the reST markup agl's docstrings use (``code``, :class:`roles`, ``Example::``
literal blocks, ``.. code-block::``, ``>>>`` lines) as the Markdown mkdocstrings renders.

:class:`ExportedNames`: a name in a package's ``__all__`` that it imports from a submodule
of the same name (``from agl_langchain.instrument import instrument``) is the imported object,
as at run time, not the submodule griffe would otherwise see there.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Any

import griffe

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # griffe loads this file by its path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agl_docs.markdown import docstring as markdown_docstring  # noqa: E402

COMPUTED = object()
"""What :func:`field_description` answers for a description the source computes (an f-string)."""


def field_description(node: ast.AST) -> str | object | None:
    """The ``description=`` string of a ``Field(...)`` call assigned by ``node``: None when there is
    none, :data:`COMPUTED` when it is not a literal."""
    value = getattr(node, "value", None)
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name != "Field":
        return None
    for keyword in value.keywords:
        if keyword.arg == "description":
            try:
                text = ast.literal_eval(keyword.value)
            except ValueError:
                return COMPUTED
            return text if isinstance(text, str) else None
    return None


def runtime_description(attr: griffe.Attribute) -> str | None:
    """The description pydantic holds for ``attr``'s field, read from the imported model (for a
    description the source computes, such as an f-string naming a variable's constant)."""
    model = attr.parent
    if model is None or not model.is_class:
        return None
    try:
        cls = getattr(importlib.import_module(model.module.path), model.name)
    except Exception:  # not importable here: no description rather than a failed build
        return None
    field = getattr(cls, "model_fields", {}).get(attr.name)
    return getattr(field, "description", None)


class FieldDescriptions(griffe.Extension):
    """Give each attribute assigned ``Field(description=...)`` that description as its docstring."""

    def on_attribute_instance(
        self, *, node: ast.AST | griffe.ObjectNode, attr: griffe.Attribute, **kwargs: Any
    ) -> None:
        """Set ``attr``'s docstring from its ``Field(description=...)`` when it has none of its own."""
        if attr.docstring is not None or not isinstance(node, ast.AST):
            return
        text = field_description(node)
        if text is COMPUTED:
            text = runtime_description(attr)
        if isinstance(text, str) and text:
            attr.docstring = griffe.Docstring(text, parent=attr)


class ExportedNames(griffe.Extension):
    """Make each exported name that a submodule of the same name shadows the object it imports."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Replace shadowing submodules in ``pkg`` (and its subpackages) by aliases of the imports."""
        for module in [pkg, *(m for m in pkg.modules.values() if m.is_package)]:
            for name in map(str, module.exports or ()):
                member = module.members.get(name)
                target = module.imports.get(name)
                if member is not None and member.is_module and target and target != member.path:
                    module.set_member(name, griffe.Alias(name, target, parent=module))


class RestMarkup(griffe.Extension):
    """Rewrite each docstring's reST markup as Markdown (see :func:`agl_docs.markdown.docstring`)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the docstrings of ``pkg`` and everything defined in it (aliases are left to their targets)."""
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = markdown_docstring(obj.docstring.value).rstrip("\n")
            stack += [m for m in obj.members.values() if not m.is_alias]
