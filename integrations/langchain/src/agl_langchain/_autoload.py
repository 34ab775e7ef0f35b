"""``AGL_LANGCHAIN=1`` with no import: loaded at interpreter start by ``agl_langchain.pth``.

The wheel installs a one-line ``agl_langchain.pth`` into site-packages. Python runs
it at every start; it only checks ``AGL_LANGCHAIN`` and, when set, imports this
module, which waits for the program to import ``langchain_core`` and then imports
:mod:`agl_langchain` (registering its configure hook). A program that never uses
LangChain pays one environment lookup; one that does gets every run captured.

``python -S``, or a ``site`` module that skips .pth files, turns this off; then
``import agl_langchain`` (still no handler to pass) does the same.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType

_TARGET = "langchain_core"
log = logging.getLogger("agl_langchain")


def _activate() -> None:
    try:
        import agl_langchain  # noqa: F401  (importing registers the hook)
    except Exception:
        log.exception("agl_langchain: AGL_LANGCHAIN is set but agl_langchain could not be loaded")


class _Loader(importlib.abc.Loader):
    """Wraps langchain_core's loader to activate agl once the package is executed."""

    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _activate()


class _Finder(importlib.abc.MetaPathFinder):
    """Sees the first import of ``langchain_core`` and wraps its loader; then leaves."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[override]
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


if _TARGET in sys.modules:
    _activate()
elif not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
