"""agl.capture.patching: what undo puts back is exactly what was there; agl's wrappers are told apart.

And agl.capture.integration.autoload, the one zero-line start every integration's .pth file runs.
"""

from __future__ import annotations

import functools
import logging
import sys
import types

import pytest

from agl.capture.integration import autoload, switch_name, switch_of
from agl.capture.patching import Patches, is_wrapped, original_of


class Base:
    def greet(self) -> str:
        return "base"


class Child(Base):
    def run(self) -> str:
        return "run"


def _loud(original):
    @functools.wraps(original)
    def loud(self):
        return original(self).upper()

    return loud


def test_wrap_replaces_and_undo_restores_an_attribute_the_class_holds():
    patches = Patches()
    original = Child.run
    replacement = patches.wrap(Child, "run", _loud)
    assert Child().run() == "RUN" and Child.run is replacement
    assert is_wrapped(Child.run) and not is_wrapped(original) and original_of(Child.run) is original
    assert Child.run.__name__ == "run"  # functools.wraps: the framework sees its method's name
    patches.undo()
    assert Child.run is original and len(patches) == 0


def test_undo_deletes_what_the_class_only_inherited():
    patches = Patches()
    patches.wrap(Child, "greet", _loud)
    assert "greet" in vars(Child) and Child().greet() == "BASE"
    patches.undo()
    assert "greet" not in vars(Child) and Child().greet() == "base" and Base.greet.__name__ == "greet"


def test_undo_goes_newest_first_and_twice_is_harmless():
    patches = Patches()
    original = Child.run
    patches.wrap(Child, "run", _loud)
    patches.wrap(Child, "run", _loud)  # on top of the first: RUN upper-cased again
    patches.replace(Child, "extra", classmethod(lambda cls: cls.__name__))
    assert len(patches) == 3 and Child.extra() == "Child"
    patches.undo()
    patches.undo()
    assert Child.run is original and not hasattr(Child, "extra")


def test_wrap_of_a_missing_attribute_raises_and_records_nothing():
    patches = Patches()
    with pytest.raises(AttributeError, match="nothing"):
        patches.wrap(Child, "nothing", _loud)
    assert len(patches) == 0


def test_a_module_function_is_patched_and_restored():
    module = types.ModuleType("agl_test_patched")
    module.f = lambda: "f"
    patches = Patches()
    patches.wrap(module, "f", lambda original: lambda: original() * 2)
    assert module.f() == "ff"
    patches.undo()
    assert module.f() == "f"


# -- the zero-line start -----------------------------------------------------------------


def test_each_integration_switch_is_declared_in_agl_env():
    for package in ("agl_langchain", "agl_autogen", "agl_openai_agents"):
        assert switch_of(package) == switch_name(package) == f"AGL_{package[4:].upper()}_INSTRUMENT"
    with pytest.raises(ValueError, match="package: 'agl_otel' has no zero-line switch"):
        switch_of("agl_otel")


def test_autoload_runs_the_integration_and_reports_a_failure_without_raising(monkeypatch, caplog):
    """A stand-in ``agl_autogen.instrument`` (in sys.modules) whose autoload works, then raises."""
    calls = []
    working = types.ModuleType("agl_autogen.instrument")
    working.autoload = lambda: calls.append("autoload") or True
    monkeypatch.setitem(sys.modules, "agl_autogen.instrument", working)
    assert autoload("agl_autogen") is True and calls == ["autoload"]

    def broken():
        raise RuntimeError("framework moved")

    failing = types.ModuleType("agl_autogen.instrument")
    failing.autoload = broken
    monkeypatch.setitem(sys.modules, "agl_autogen.instrument", failing)
    with caplog.at_level(logging.ERROR, logger="agl_autogen"):
        assert autoload("agl_autogen") is False
    assert "agl_autogen: AGL_AUTOGEN_INSTRUMENT is on but instrumenting failed" in caplog.text
    assert "framework moved" in caplog.text
