"""The one way an integration patches a framework: :class:`Patches`, a set of attribute replacements undone together.

Integrations that hook a framework's classes or modules (agl-autogen's clients, agents,
teams and tools; agl-openai-agents' two model hooks) go through one object per set of
hooks::

    _patches = Patches()

    def install() -> None:
        _patches.wrap(SomeModel, "_fetch_response", noting_ids)  # SomeModel._fetch_response = noting_ids(original)

    def uninstall() -> None:
        _patches.undo()

What :meth:`Patches.undo` puts back is exactly what was there: an attribute the owner
held itself is restored, one it only inherited is deleted again (so the owner inherits
it once more, as before). A replacement made by :meth:`Patches.wrap` is marked, so
:func:`is_wrapped` tells agl's own wrapper from the framework's method and nothing is
wrapped twice. Like ``wrapt.wrap_function_wrapper`` / ``unwrap``, which OpenTelemetry's
instrumentations use, but without a dependency: the wrapper is a plain function
(``functools.wraps`` keeps the signature and name), so ``inspect`` and the framework's
own checks (``__isabstractmethod__``, ``vars(cls)``) see what they saw before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MARK = "__agl_original__"


def is_wrapped(value: Any) -> bool:
    """Whether ``value`` is a replacement :meth:`Patches.wrap` made (agl's wrapper, not the framework's own)."""
    return hasattr(value, _MARK)


def original_of(value: Any) -> Any:
    """What :meth:`Patches.wrap` wrapped to make ``value``; ``value`` itself if it is not agl's wrapper."""
    return getattr(value, _MARK, value)


@dataclass(frozen=True, slots=True)
class _Applied:
    owner: Any
    name: str
    held: bool
    """Whether ``owner`` held ``name`` itself (in its ``__dict__``) before the patch."""
    previous: Any
    """What ``owner.__dict__[name]`` was (None when it did not hold it)."""


class Patches:
    """Attribute replacements on framework classes and modules, undone together, newest first.

    Thread-safe; each integration keeps one (or one per independently installed hook).
    """

    def __init__(self) -> None:
        self._applied: list[_Applied] = []
        self._lock = threading.RLock()

    def wrap(self, owner: Any, name: str, wrapper: Callable[[Any], Any]) -> Any:
        """Set ``owner.name`` to ``wrapper(owner.name)``, marked as agl's; return the replacement.

        ``owner.name`` is read as attribute access gives it (for a class: the plain function).
        Raises AttributeError, naming the owner, when it has no such attribute.
        """
        current = getattr(owner, name)
        replacement = wrapper(current)
        setattr(replacement, _MARK, current)
        self.replace(owner, name, replacement)
        return replacement

    def replace(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name`` to ``value`` as it is (a ``classmethod``, a constant), to be undone with the rest."""
        with self._lock:
            held = name in vars(owner)
            self._applied.append(_Applied(owner, name, held, vars(owner).get(name) if held else None))
            setattr(owner, name, value)

    def undo(self) -> None:
        """Put back everything replaced, newest first (idempotent)."""
        with self._lock:
            while self._applied:
                applied = self._applied.pop()
                if applied.held:
                    setattr(applied.owner, applied.name, applied.previous)
                else:
                    delattr(applied.owner, applied.name)

    def __len__(self) -> int:
        """How many replacements are in place."""
        return len(self._applied)
