"""Zero-line capture: instrument(), the AGL_LANGCHAIN_INSTRUMENT variable, and the .pth autoload."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import agl
import agl_langchain
from agl.capture import error_guard
from agl.store.sqlite import SqliteStore
from agl_langchain import AglCallbackHandler
from tests.langchain.fakes import fake_model
from tests.langchain.test_graph import writer_graph

REPLIES = ["a draft", "bad", "a better draft", "good"]


@pytest.fixture(autouse=True)
def _off(monkeypatch):
    monkeypatch.delenv("AGL_LANGCHAIN_INSTRUMENT", raising=False)
    agl_langchain.uninstrument()
    yield
    agl_langchain.uninstrument()


def test_instrument_and_uninstrument(cap):
    handler = agl_langchain.instrument()
    assert agl_langchain.active_handler() is handler
    with agl.use_rollout(cap.ctx):
        writer_graph(fake_model(REPLIES)).invoke({"topic": "owls"})
    llm = cap.spans(kind="llm")
    assert [s.attributes["gen_ai.agent.name"] for s in sorted(llm, key=lambda s: s.seq)] == [
        "write",
        "check",
        "rewrite",
        "check",
    ]

    agl_langchain.uninstrument()
    assert agl_langchain.active_handler() is None
    other = agl.RolloutContext(rollout_id="ro-after", writer=cap.writer)
    with agl.use_rollout(other):
        writer_graph(fake_model(REPLIES)).invoke({"topic": "owls"})
    assert cap.spans("ro-after") == []


def test_explicit_handler_is_not_doubled(cap):
    agl_langchain.instrument()
    with agl.use_rollout(cap.ctx):
        fake_model(["hi"]).invoke("hello", config={"callbacks": [AglCallbackHandler()]})
    assert len(cap.spans(kind="llm")) == 1


def test_env_var_in_process(cap, monkeypatch):
    monkeypatch.setenv("AGL_LANGCHAIN_INSTRUMENT", "1")
    with agl.use_rollout(cap.ctx):
        fake_model(["hi"]).invoke("hello")
    assert len(cap.spans(kind="llm")) == 1
    monkeypatch.setenv("AGL_LANGCHAIN_INSTRUMENT", "0")
    off = agl.RolloutContext(rollout_id="ro-off", writer=cap.writer)
    with agl.use_rollout(off):
        fake_model(["hi"]).invoke("hello")
    assert cap.spans("ro-off") == []


def test_env_var_with_a_value_it_refuses_is_reported_once_and_off(cap, monkeypatch, caplog):
    error_guard("agl_langchain").errors.clear()
    monkeypatch.setenv("AGL_LANGCHAIN_INSTRUMENT", "enabled")
    with caplog.at_level(logging.WARNING, logger="agl_langchain"), agl.use_rollout(cap.ctx):
        assert fake_model(["hi"]).invoke("hello").content == "hi"
        assert fake_model(["hi"]).invoke("hello").content == "hi"
    assert cap.spans(kind="llm") == []
    assert [r.getMessage().count("AGL_LANGCHAIN_INSTRUMENT='enabled'") for r in caplog.records] == [1]


AGENT = textwrap.dedent(
    """
    import sys
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    model = GenericFakeChatModel(messages=iter([AIMessage("pong")]))
    assert model.invoke("ping").content == "pong"
    print("loaded" if "agl_langchain" in sys.modules else "not loaded")
    """
)


@pytest.mark.parametrize("flag", ["1", "", "off"])
def test_env_var_with_no_import_at_all(tmp_path, flag):
    """The agent program names neither agl nor agl_langchain: the installed .pth does it."""
    db = tmp_path / "prod.db"
    env = {**os.environ, "AGL_STORE_URL": f"sqlite:///{db}", "AGL_LANGCHAIN_INSTRUMENT": flag}
    done = subprocess.run([sys.executable, "-c", AGENT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    on = flag == "1"
    assert done.stdout.strip() == ("loaded" if on else "not loaded")
    if not on:
        assert not db.exists()
        return
    store = SqliteStore(db)
    try:
        (llm,) = list(store.query_spans(production=True, kind="llm"))
    finally:
        store.close()
    assert llm.rollout_id is None
    assert llm.attributes["gen_ai.output.messages"] == [{"role": "assistant", "content": "pong"}]


def test_the_autoload_warns_once_about_a_misspelled_variable(tmp_path):
    """Switched on, the agent's process warns about ``AGL_STORE_ULR`` (set, read by nothing) once,
    naming the variable it probably meant, and still runs the agent."""
    env = {**os.environ, "AGL_STORE_URL": f"sqlite:///{tmp_path / 'prod.db'}", "AGL_LANGCHAIN_INSTRUMENT": "1"}
    env["AGL_STORE_ULR"] = "sqlite:///elsewhere.db"
    done = subprocess.run([sys.executable, "-c", AGENT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr
    line = "$AGL_STORE_ULR is set but agl reads no such variable; did you mean $AGL_STORE_URL?"
    assert done.stderr.count(line) == 1, done.stderr
