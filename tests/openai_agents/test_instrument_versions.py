"""agl-openai-agents on an Agents SDK outside its range: a clear warning, or with AGL_STRICT_VERSIONS an error."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings

import pytest

import agl_openai_agents
from agl.capture import versions
from agl.capture.versions import UnsupportedVersionError, UntestedVersionWarning
from agl.env import STRICT_VERSIONS
from agl_openai_agents import AglTracingProcessor
from tests.versions import fake_installed_version

instrument_module = importlib.import_module("agl_openai_agents.instrument")


def _fake(monkeypatch, version: str) -> None:
    fake_installed_version(monkeypatch, "openai-agents", version)


@pytest.fixture
def fresh_instrument(monkeypatch):
    """instrument() as on first use: no processor yet; add_trace_processor recorded, not called."""
    added = []
    monkeypatch.setattr(instrument_module, "_processor", None)
    monkeypatch.setattr("agents.add_trace_processor", added.append)
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)
    return added


def test_tested_range_holds_the_installed_sdk():
    assert instrument_module.TESTED == "openai-agents>=0.24,<0.25"
    assert versions.satisfies(importlib.metadata.version("openai-agents"), instrument_module.TESTED)


def test_inside_the_range_instrument_works_without_a_warning(fresh_instrument):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedVersionWarning)
        processor = agl_openai_agents.instrument()
    assert fresh_instrument == [processor] and processor.enabled


def test_outside_the_range_instrument_warns_naming_the_version_the_range_and_what_works(monkeypatch, fresh_instrument):
    _fake(monkeypatch, "0.31.2")
    with pytest.warns(UntestedVersionWarning) as caught:
        processor = agl_openai_agents.instrument()
    assert fresh_instrument == [processor] and processor.enabled  # it still instruments
    message = str(caught[0].message)
    assert "openai-agents 0.31.2 is installed" in message
    assert "tested with openai-agents>=0.24,<0.25" in message
    assert "Still works: the trace processor" in message
    assert "OpenAIChatCompletionsModel._fetch_response" in message
    assert len(caught) == 1


def test_outside_the_range_strict_raises_before_adding_anything(monkeypatch, fresh_instrument):
    _fake(monkeypatch, "0.31.2")
    monkeypatch.setenv(STRICT_VERSIONS, "1")
    with pytest.raises(UnsupportedVersionError, match=r"openai-agents 0\.31\.2 is installed"):
        agl_openai_agents.instrument()
    assert fresh_instrument == []
    assert not agl_openai_agents.instrumented()
    with pytest.raises(UnsupportedVersionError):
        AglTracingProcessor()  # the one-line path too
