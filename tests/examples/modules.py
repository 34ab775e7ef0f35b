"""The example modules a test file uses, imported when its fixture first runs (not at collection)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace


def example_modules(example: str, *names: str) -> SimpleNamespace:
    """``examples.<example>.<name>`` for each name, as attributes named after the modules."""
    return SimpleNamespace(**{name: importlib.import_module(f"examples.{example}.{name}") for name in names})
