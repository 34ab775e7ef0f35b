"""agl-langchain on a langchain-core outside its range: a clear warning, or with AGL_STRICT_VERSIONS an error."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings

import pytest

import agl_langchain
from agl.capture import versions
from agl.capture.versions import UnsupportedVersionError, UntestedVersionWarning
from agl.env import STRICT_VERSIONS
from tests.versions import fake_installed_version

instrument_module = importlib.import_module("agl_langchain.instrument")


def _fake(monkeypatch, version: str) -> None:
    fake_installed_version(monkeypatch, "langchain-core", version)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(agl_langchain.ENV_VAR, raising=False)
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)
    agl_langchain.uninstrument()
    yield
    agl_langchain.uninstrument()


def test_tested_range_holds_the_installed_langchain_core():
    assert instrument_module.TESTED == "langchain-core>=1.0,<2"
    assert versions.satisfies(importlib.metadata.version("langchain-core"), instrument_module.TESTED)


def test_inside_the_range_instrument_works_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedVersionWarning)
        handler = agl_langchain.instrument()
    assert agl_langchain.active_handler() is handler


def test_outside_the_range_instrument_warns_and_still_captures(monkeypatch):
    _fake(monkeypatch, "2.0.0")
    with pytest.warns(UntestedVersionWarning) as caught:
        handler = agl_langchain.instrument()
    assert agl_langchain.active_handler() is handler
    message = str(caught[0].message)
    assert "langchain-core 2.0.0 is installed" in message
    assert "tested with langchain-core>=1.0,<2" in message
    assert "agl-langchain uses no private LangChain API" in message


def test_the_env_switch_checks_at_start(monkeypatch):
    _fake(monkeypatch, "2.0.0")
    monkeypatch.setenv(agl_langchain.ENV_VAR, "1")
    with pytest.warns(UntestedVersionWarning, match="langchain-core 2.0.0 is installed"):
        assert instrument_module.autoload() is True
    monkeypatch.setenv(agl_langchain.ENV_VAR, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedVersionWarning)
        assert instrument_module.autoload() is False  # switched off: no check, no warning


def test_outside_the_range_strict_raises(monkeypatch):
    _fake(monkeypatch, "2.0.0")
    monkeypatch.setenv(STRICT_VERSIONS, "1")
    with pytest.raises(UnsupportedVersionError, match=r"langchain-core 2\.0\.0 is installed"):
        agl_langchain.instrument()
    assert agl_langchain.active_handler() is None
