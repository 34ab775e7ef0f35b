"""What plugins provide: the kinds of component, and the registrations made through the ``agl_register_*`` hooks.

Every provider hook has one shape, ``agl_register_<kind>s(register)``, and a plugin
calls ``register(name, factory, description="")`` once per thing it provides (see
:mod:`agl.hookspecs` for why). The registry calls each implementation alone with a
``register`` bound to its plugin's name (:meth:`Registrations.bound_to`), so a
:class:`Registrations` knows, for each name, which plugin gave it. This module only
describes them: the registry, :mod:`agl.plugins`, makes the calls
(:func:`agl.plugins.registrations` lists them in call order, :func:`agl.plugins.resolve`
finds one: the first in call order wins a name).

A name is checked where it is registered: an empty or malformed name, a factory that
is not callable, a name the same plugin registers twice, or a replacement for one of
agl's own store schemes is a :class:`~agl.errors.ConfigError` naming the plugin, the
hook and the field. The check runs when the plugin is registered, so a plugin with a
bad registration is refused before anything is asked of it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agl.errors import ConfigError


@dataclass(frozen=True)
class Kind:
    """A kind of thing plugins provide."""

    name: str
    """How :func:`agl.plugins.resolve` and errors name it (``backend``, ``credit_assignment``)."""
    builds: bool
    """Whether :func:`agl.plugins.resolve` calls the factory with the config (backends, engines) or returns it."""
    pattern: re.Pattern[str]
    """What a name of this kind may look like."""
    fixed: bool = False
    """Whether agl's own names of this kind may not be replaced by a plugin's (store schemes)."""

    @property
    def hook(self) -> str:
        """The hook plugins register this kind through: ``agl_register_<kind>s``."""
        return f"agl_register_{self.name}s"

    @property
    def what(self) -> str:
        """The kind in words, for messages (``credit assignment``)."""
        return self.name.replace("_", " ")


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("backend", builds=True, pattern=_NAME),
        Kind("engine", builds=True, pattern=_NAME),
        Kind("credit_assignment", builds=False, pattern=_NAME),
        Kind("store_scheme", builds=False, pattern=re.compile(r"[a-z][a-z0-9+.-]*"), fixed=True),
        Kind("logger", builds=False, pattern=_NAME),
        Kind("command", builds=False, pattern=re.compile(r"[a-z][a-z0-9-]*")),
    )
}
"""Every kind, by name; its hook is ``agl_register_<name>s``."""
HOOKS: dict[str, Kind] = {kind.hook: kind for kind in KINDS.values()}
"""Every kind, by the name of its hook."""

ENTRY_POINT_GROUP = "agl"
"""The entry-point group installed plugins are found in; ``agl.<kind>`` groups declare what they provide."""


@dataclass(frozen=True)
class Provided:
    """One registration: ``plugin`` registered ``factory`` as the ``kind`` called ``name``."""

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    description: str = ""


class Registrations:
    """What one call of a provider hook collected, in call order.

    The registry hands each implementation :meth:`bound_to` its plugin as ``register``,
    so a registration always carries the name of the plugin that made it.
    """

    def __init__(self, kind: Kind, fixed: dict[str, Provided] | None = None):
        self.kind = kind
        self.found: list[Provided] = []
        self._fixed = fixed or {}

    def bound_to(self, plugin: str) -> Callable[..., None]:
        """The ``register`` function ``plugin``'s implementation is called with."""

        def register(name: str, factory: Callable[..., Any], description: str = "") -> None:
            self.add(plugin, name, factory, description)

        register.__doc__ = f"Register the {self.kind.what} ``name``, provided by ``factory`` (plugin {plugin!r})."
        return register

    def __call__(self, name: str, factory: Callable[..., Any], description: str = "") -> None:
        """A registration by an implementation that was not bound (this object passed to pluggy's relay itself)."""
        self.add("(unknown plugin)", name, factory, description)

    def add(self, plugin: str, name: Any, factory: Any, description: Any = "") -> None:
        """Record one registration; a bad one is a ConfigError naming the plugin, the hook and the field."""
        kind = self.kind
        where = f"plugin {plugin!r}, hook {kind.hook!r}: register(name={name!r})"
        if not isinstance(name, str) or not kind.pattern.fullmatch(name):
            raise ConfigError(f"{where}: name: expected a {kind.what} name matching {kind.pattern.pattern}")
        if not callable(factory):
            raise ConfigError(f"{where}: factory: expected a callable, got {type(factory).__name__}")
        if not isinstance(description, str):
            raise ConfigError(f"{where}: description: expected a string, got {type(description).__name__}")
        if any(p.plugin == plugin and p.name == name for p in self.found):
            raise ConfigError(f"{where}: name: registered twice by the same plugin")
        owner = self._fixed.get(name)
        if owner is not None and owner.plugin != plugin:
            raise ConfigError(f"{where}: name: the {kind.what} {name!r} is agl's own ({owner.plugin}), not replaceable")
        self.found.append(Provided(kind.name, name, factory, plugin, description))

    def winners(self) -> dict[str, Provided]:
        """Each name once: the first registration in call order."""
        out: dict[str, Provided] = {}
        for provided in self.found:
            out.setdefault(provided.name, provided)
        return out


def kind_of(kind: str) -> Kind:
    """The :class:`Kind` called ``kind``; a ValueError lists the kinds there are."""
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"kind: no kind {kind!r} (agl has: {', '.join(KINDS)})") from None


def declared_by(kind: str, name: str) -> str | None:
    """The installed distribution that declares it provides the ``kind`` called ``name``, or None.

    A plugin package declares what it provides, besides registering it, as entry points in
    the group ``agl.<kind>`` (``agl.backend``, ``agl.engine``, ...), one per name, valued
    with its plugin module; agl-verl's ``pyproject.toml``::

        [project.entry-points."agl.backend"]
        verl = "agl_verl.plugin"

    Read from the installed metadata, without importing anything: so the error for a name
    no loaded plugin provides can name the package that does (installed, but left out by
    ``AGL_LOAD_PLUGINS``).
    """
    from importlib.metadata import entry_points

    for entry_point in entry_points(group=f"{ENTRY_POINT_GROUP}.{kind_of(kind).name}", name=name):
        dist = entry_point.dist
        if dist is not None:
            return str(dist.name)
    return None


def not_provided(kind: str, name: str, known: list[str]) -> str:
    """The message for a ``kind`` called ``name`` that none of the ``known`` names is."""
    what = kind_of(kind).what
    installed = f"installed: {', '.join(known) or 'none'}"
    package = declared_by(kind, name)
    if package is not None:
        return f"no {what} {name!r}: pip install {package} (it provides it; {installed})"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{what}: no plugin provides {name!r} ({hint}{installed}; see agl plugins)"
