"""agl-autogen on an AgentChat outside its tested range: a clear warning, or with AGL_STRICT_VERSIONS an error."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings

import pytest
from autogen_ext.models.replay import ReplayChatCompletionClient

import agl_autogen
from agl.capture import versions
from agl.capture.patching import is_wrapped
from agl.capture.versions import UnsupportedVersionError, UntestedVersionWarning
from agl.env import STRICT_VERSIONS
from agl_autogen import AglChatCompletionClient
from tests.versions import fake_installed_version

instrument_module = importlib.import_module("agl_autogen.instrument")
structure_module = importlib.import_module("agl_autogen.structure")

PLACE = "install structure hooks on an untested AgentChat version"


def _fake(monkeypatch, version: str) -> None:
    fake_installed_version(monkeypatch, "autogen-agentchat", version)


@pytest.fixture(autouse=True)
def clean():
    agl_autogen.uninstrument()
    yield
    agl_autogen.uninstrument()


def _client_hooked() -> bool:
    return is_wrapped(vars(ReplayChatCompletionClient)["create"])


def test_tested_range_holds_the_installed_agentchat():
    assert instrument_module.TESTED == "autogen-agentchat>=0.7,<0.8"
    assert versions.satisfies(importlib.metadata.version("autogen-agentchat"), instrument_module.TESTED)


def test_inside_the_range_instrument_works_without_a_warning(monkeypatch):
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedVersionWarning)
        agl_autogen.instrument()
    assert agl_autogen.instrumented() and _client_hooked()


def test_outside_the_range_instrument_warns_and_the_client_hooks_still_go_in(monkeypatch):
    _fake(monkeypatch, "0.8.1")
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)

    def moved(original):  # as if AgentChat had moved its private module
        raise AttributeError("module 'autogen_agentchat.agents._base_chat_agent' has no 'trace_invoke_agent_span'")

    monkeypatch.setattr(structure_module, "_wrap_invoke_agent", moved)
    before = agl_autogen.errors[PLACE]
    with pytest.warns(UntestedVersionWarning) as caught:
        agl_autogen.instrument()
    message = str(caught[0].message)
    assert "autogen-agentchat 0.8.1 is installed" in message
    assert "tested with autogen-agentchat>=0.7,<0.8" in message
    assert "Still works: AglChatCompletionClient and the client hooks" in message
    assert agl_autogen.instrumented() and _client_hooked()
    assert agl_autogen.errors[PLACE] == before + 1


def test_inside_the_range_a_structure_failure_is_not_hidden(monkeypatch):
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)

    def broken(original):
        raise AttributeError("broken")

    monkeypatch.setattr(structure_module, "_wrap_invoke_agent", broken)
    with pytest.raises(AttributeError, match="broken"):
        agl_autogen.instrument()


def test_outside_the_range_strict_raises_before_patching(monkeypatch):
    _fake(monkeypatch, "0.8.1")
    monkeypatch.setenv(STRICT_VERSIONS, "1")
    with pytest.raises(UnsupportedVersionError, match=r"autogen-agentchat 0\.8\.1 is installed"):
        agl_autogen.instrument()
    assert not agl_autogen.instrumented() and not _client_hooked()
    replay = ReplayChatCompletionClient(["hi"])
    with pytest.raises(UnsupportedVersionError):
        AglChatCompletionClient(replay)  # the one-line path too
