"""Capture that is on and records nothing is said: what counts as on, the misspelled switch, and the
trainer's one warning a run (a real short run: SqliteStore, the in-process gateway and runner,
tests/fake_engine.py as the model, TinyBackend as the backend)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from agl_trainer import capture_check
from agl_trainer.capture_check import capture_switched_on, misspelled_switches, switched_on_by
from agl_trainer.trainer import Trainer
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, _tasks, agent, small_config


def test_the_integrations_switches_and_the_otel_launcher_count_as_on():
    environ = {"AGL_LANGCHAIN_INSTRUMENT": " Yes ", "AGL_AUTOGEN_INSTRUMENT": "0", "AGL_OPENAI_AGENTS_INSTRUMENT": "1"}
    assert switched_on_by(environ) == [
        "agl-langchain ($AGL_LANGCHAIN_INSTRUMENT)",
        "agl-openai-agents ($AGL_OPENAI_AGENTS_INSTRUMENT)",
    ]
    launched = ["/venv/bin/opentelemetry-instrument", "python", "agent.py"]
    assert switched_on_by({}, launched) == ["agl-otel (opentelemetry-instrument)"]
    # agl's instrumentor left out by OpenTelemetry's own switch: nothing of agl's is on
    assert switched_on_by({"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "requests, agl"}, launched) == []
    assert switched_on_by({}, ["python", "agent.py"]) == []


def test_a_misspelled_switch_is_named_with_the_one_it_likely_meant():
    environ = {"AGL_LANGCHAIN_INSTRUMNT": "1", "AGL_STORE_URL": "x", "AGL_OPENAI_AGENT_INSTRUMENT": "on"}
    assert misspelled_switches(environ) == [
        "$AGL_LANGCHAIN_INSTRUMNT (agl reads no such variable; did you mean $AGL_LANGCHAIN_INSTRUMENT?)",
        "$AGL_OPENAI_AGENT_INSTRUMENT (agl reads no such variable; did you mean $AGL_OPENAI_AGENTS_INSTRUMENT?)",
    ]
    assert misspelled_switches({"AGL_LANGCHAIN_INSTRUMNT": "0"}) == []  # switched off: nothing was meant on
    assert switched_on_by({"AGL_LANGCHAIN_INSTRUMNT": "1"}) == misspelled_switches({"AGL_LANGCHAIN_INSTRUMNT": "1"})


@pytest.fixture
def nothing_instrumented_here(monkeypatch):
    """Integrations instrumented in this test process left out: other tests of the suite import
    examples.rag_agent.agent, which instruments agl-openai-agents at import (a fresh process
    checks the in-code case: test_an_integration_instrumented_in_code_counts_as_on)."""
    monkeypatch.setattr(capture_check, "_IN_PROCESS", {})


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("nothing_instrumented_here")
def test_the_trainer_says_once_a_run_that_capture_was_on_and_joined_no_span(tmp_path, monkeypatch, caplog):
    """The agent calls the gateway with httpx, which no integration sees: every rollout has calls and no span."""
    monkeypatch.setenv("AGL_AUTOGEN_INSTRUMENT", "1")  # read at interpreter start only: nothing is instrumented
    assert capture_switched_on() == ["agl-autogen ($AGL_AUTOGEN_INSTRUMENT)"]
    with FakeEngine() as engine, caplog.at_level(logging.WARNING, logger="agl_trainer.trainer"):
        config = small_config(tmp_path, engine, steps=2)
        result = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, _tasks(2))
    said = [r.getMessage() for r in caplog.records if "capture was on" in r.getMessage()]
    assert len(said) == 1, said  # two steps, each with 4 such rollouts: said once
    assert said[0].startswith("capture was on (agl-autogen ($AGL_AUTOGEN_INSTRUMENT)) but 4 finished rollout(s)")
    train = [r for r in result.history if r["kind"] == "train"]
    for record in train:  # the build report's join counts are in every step record, zeros too
        assert record["build_joined_by_id"] == 0 and record["build_joined_by_order"] == 0
        assert record["build_gateway_only"] == 8 and record["build_text_only"] == 0
        assert record["build_rollouts_without_spans"] == 4


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("nothing_instrumented_here")
def test_the_trainer_says_nothing_when_no_capture_is_on(tmp_path, monkeypatch, caplog):
    for name in ("AGL_LANGCHAIN_INSTRUMENT", "AGL_AUTOGEN_INSTRUMENT", "AGL_OPENAI_AGENTS_INSTRUMENT"):
        monkeypatch.delenv(name, raising=False)
    with FakeEngine() as engine, caplog.at_level(logging.WARNING, logger="agl_trainer.trainer"):
        Trainer(small_config(tmp_path, engine), backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, _tasks(2))
    assert not [r for r in caplog.records if "capture was on" in r.getMessage()]


IN_PROCESS = """
import agl_otel
from agl_trainer.capture_check import capture_switched_on
print(capture_switched_on())
agl_otel.instrument()
print(capture_switched_on())
agl_otel.uninstrument()
print(capture_switched_on())
"""


def test_an_integration_instrumented_in_code_counts_as_on():
    """agl_otel.instrument() in the trainer's own process (a fresh one: it sets the global tracer provider)."""
    environ = {k: v for k, v in os.environ.items() if not k.endswith("_INSTRUMENT")}
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS], env=environ, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "['agl-otel (instrumented in this process)']", "[]"]
