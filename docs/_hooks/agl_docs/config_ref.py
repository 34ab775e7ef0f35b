"""The trainer-config reference, walked from the pydantic models of :class:`agl_trainer.TrainerConfig`."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agl_docs.markdown import cell, code, inline, table


def type_name(annotation: Any) -> str:
    """How a field's type reads in the reference: ``int | None``, ``list[str]``, ``"a" | "b"``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def default_of(field: FieldInfo) -> str:
    """The field's default as the reference shows it (``required`` when it has none)."""
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, Path):
        value = str(value)
    return code(repr(value) if not isinstance(value, str) else repr(value))


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (itself, or in ``X | None``, ``list[X]``), if any."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(nested_model, typing.get_args(annotation)) if m is not None), None)


def sections(model: type[BaseModel], key: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """Each model under ``model`` with the dotted key it sits at (``[]`` for a list's items), depth first."""
    yield key, model
    for name, field in model.model_fields.items():
        inner = nested_model(field.annotation)
        if inner is not None:
            is_list = typing.get_origin(field.annotation) is list or any(
                typing.get_origin(a) is list for a in typing.get_args(field.annotation)
            )
            yield from sections(inner, f"{key}{name}{'[]' if is_list else ''}.")


def rows(model: type[BaseModel], key: str) -> list[list[str]]:
    """One table row per field of ``model``: the dotted key, type, default and description."""
    out = []
    for name, field in model.model_fields.items():
        about = field.description or ""
        inner = nested_model(field.annotation)
        if not about and inner is not None:
            about = (inspect.getdoc(inner) or "").split("\n\n")[0]
        out.append([code(f"{key}{name}"), code(type_name(field.annotation)), default_of(field), cell(about)])
    return out


def page(model: type[BaseModel]) -> str:
    """The Markdown page: the root model's fields, then one section per nested model."""
    out = [
        "# Trainer configuration",
        "",
        f"Generated from `{model.__module__}.{model.__name__}` each time the site is built: every field,",
        "its type, its default and what it means. `agl train --config FILE` reads these keys from",
        "YAML, JSON or TOML (at the top level or under `trainer:`); `--set KEY=VALUE` overrides one by",
        "its dotted key. An unknown key is an error naming it.",
        "",
    ]
    for key, inner in sections(model):
        if key:
            out += [f"## `{key.rstrip('.')}`: {inner.__name__}", ""]
        doc = inspect.getdoc(inner)
        if doc:
            out += [inline(doc), ""]
        if inner.model_config.get("extra") == "allow":
            out += ["Keys besides these are the component's own options, passed to it as they are.", ""]
        out.append(table(["key", "type", "default", "meaning"], rows(inner, key)))
    return "\n".join(out)


def trainer_page() -> str:
    """The page for :class:`agl_trainer.TrainerConfig`."""
    from agl_trainer.config import TrainerConfig

    return page(TrainerConfig)
