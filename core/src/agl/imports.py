"""Importing what a user names on a command line or in a config: ``module:attribute`` specs.

``module`` is a dotted module name (found from the current directory too) or a path to
a ``.py`` file; ``what`` names the option in errors (``agent``, ``plugins[0]``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from agl.errors import ConfigError


def import_module(module_name: str, what: str) -> ModuleType:
    """Import a dotted module name or a ``.py`` file; a :class:`~agl.errors.ConfigError` naming ``what`` if it fails."""
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.exists(path):
            raise ConfigError(f"{what}: file {module_name!r} does not exist")
        name = os.path.splitext(os.path.basename(path))[0]
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: cannot import module {module_name!r}: {exc}") from exc


def import_attribute(module: ModuleType, attr: str, what: str) -> Any:
    """``module.attr``; a :class:`~agl.errors.ConfigError` naming ``what`` if there is none."""
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what}: module {module.__name__!r} has no attribute {attr!r}") from None
