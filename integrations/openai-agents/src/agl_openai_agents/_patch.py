"""A method of a framework class wrapped once, and put back on demand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class MethodPatch:
    """Replaces ``name`` on the class ``load_class()`` returns with ``wrap(original)``.

    The class is loaded only when the patch is installed, so importing the module that
    declares a patch imports nothing of the framework.
    """

    def __init__(self, load_class: Callable[[], type], name: str, wrap: Callable[[Any], Any]):
        self._load_class = load_class
        self._name = name
        self._wrap = wrap
        self._installed: tuple[type, Any] | None = None

    def install(self) -> None:
        """Wrap the method (idempotent)."""
        if self._installed is not None:
            return
        cls = self._load_class()
        original = getattr(cls, self._name)
        setattr(cls, self._name, self._wrap(original))
        self._installed = (cls, original)

    def uninstall(self) -> None:
        """Put the original method back (idempotent)."""
        if self._installed is None:
            return
        cls, original = self._installed
        setattr(cls, self._name, original)
        self._installed = None
