"""agl-otel as a user runs it: ``agl run --gateway ... -- opentelemetry-instrument python agent.py``,
and what ``agl run`` says when capture that was switched on recorded no LLM span.

Everything is real: the gateway on 127.0.0.1 (in front of tests/fake_engine.py, the model's
test double), a SQLite store, ``agl run`` and ``agl export`` as commands, OpenTelemetry's own
``opentelemetry-instrument`` launcher, the ``openai`` client, and the GenAI instrumentation
from the package index (opentelemetry-instrumentation-genai-openai, entry point ``openai``).

The second test stands in for opentelemetry-instrumentation-openai-v2 2.4b0 next to
opentelemetry-util-genai 1.3b0, whose instrumentor fails to import: this test puts on the
agent's path a distribution of its own (made here, in ``tmp_path``) whose instrumentor imports
a module opentelemetry-util-genai does not have, and switches the real one off, so the agent
runs with capture on and no LLM instrumentation, as those users' agents did.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agl.schema import RolloutStatus

CLI = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
LAUNCHER = str(Path(sys.executable).parent / "opentelemetry-instrument")

AGENT = """
from openai import OpenAI

client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from agl run
for question in ("first?", "second?"):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
"""

BROKEN_INSTRUMENTOR = """
# Fails the way an instrumentor built for another opentelemetry-util-genai fails: a module it
# needs is not in the installed version (ModuleNotFoundError, which opentelemetry-instrument
# skips with a debug message only).
from opentelemetry.util.genai.a_module_of_another_version import Handler  # noqa: F401
"""


def agl_run(
    store, gateway, tmp_path: Path, *, launcher: bool = True, agent: str = AGENT, **child_env: str
) -> subprocess.CompletedProcess:
    """``agl run`` the ``agent`` program (under ``opentelemetry-instrument`` unless ``launcher`` is false);
    ``child_env`` added to its environment."""
    script = tmp_path / "agent.py"
    script.write_text(agent)
    environ = dict(
        os.environ,
        AGL_ROLLOUT_KEY_SECRET=gateway.keys.secret,
        OTEL_TRACES_EXPORTER="none",  # the spans go to agl only, no OTLP collector here
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        **child_env,
    )
    args = ["run", "--store", f"sqlite:///{store.path}", "--gateway", gateway.url, "--timeout", "60"]
    return subprocess.run(
        [*CLI, *args, "--", *([LAUNCHER] if launcher else []), sys.executable, str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def clean_run(store, done: subprocess.CompletedProcess) -> tuple:
    """``agl run`` ended well and warned of nothing: its one rollout (succeeded), its calls and its LLM spans."""
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    (rollout,) = store.query_rollouts()
    assert rollout.status == RolloutStatus.SUCCEEDED
    calls = list(store.query_llm_calls(rollout_ids=[rollout.rollout_id]))
    spans = list(store.query_spans(rollout_ids=[rollout.rollout_id], kind="llm"))
    return rollout, calls, spans


def agl_export(store, tmp_path: Path) -> subprocess.CompletedProcess:
    out = tmp_path / "transitions.jsonl"
    args = ["export", "transitions", "--store", f"sqlite:///{store.path}", "--missing-reward", "0", "-o", str(out)]
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def broken_distribution(tmp_path: Path) -> Path:
    """A directory holding an installed-looking distribution whose ``opentelemetry_instrumentor``
    entry point fails to import."""
    site = tmp_path / "site"
    info = site / "standin_openai_instrumentation-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: standin-openai-instrumentation\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[opentelemetry_instrumentor]\nopenai_standin = standin_openai_instrumentation:OpenAIInstrumentor\n"
    )
    (site / "standin_openai_instrumentation.py").write_text(BROKEN_INSTRUMENTOR)
    return site


@pytest.mark.timeout(300)
def test_a_real_instrumentation_under_agl_run_joins_every_call_by_id(rig, tmp_path):
    store, gateway = rig
    rollout, calls, spans = clean_run(store, agl_run(store, gateway, tmp_path))
    assert len(calls) == 2
    assert sorted(s.attributes["gen_ai.response.id"] for s in spans) == sorted(c.call_id for c in calls)

    export = agl_export(store, tmp_path)
    assert export.returncode == 0, export.stderr
    assert "2 calls joined to their span by id, 0 by order, 0 unjoined (no LLM span)" in export.stderr


@pytest.mark.timeout(300)
def test_an_instrumentor_that_fails_to_load_is_said_once_and_counted_unjoined(rig, tmp_path):
    store, gateway = rig
    site = broken_distribution(tmp_path)
    load = "import importlib.metadata as m; [e.load() for e in m.entry_points(group='opentelemetry_instrumentor')]"
    loaded = subprocess.run(
        [sys.executable, "-c", load], env=dict(os.environ, PYTHONPATH=str(site)), capture_output=True, text=True
    )
    assert "ModuleNotFoundError: No module named 'opentelemetry.util.genai.a_module_of" in loaded.stderr, loaded
    done = agl_run(
        store,
        gateway,
        tmp_path,
        PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai",  # the working instrumentation is not there
    )
    assert done.returncode == 0, done.stderr  # the run "succeeds": nothing failed that the agent saw
    (rollout,) = store.query_rollouts()
    assert len(list(store.query_llm_calls())) == 2 and not list(store.query_spans(kind="llm"))
    warnings = [line for line in done.stderr.splitlines() if line.startswith("agl run: warning:")]
    assert len(warnings) == 1, done.stderr
    (warning,) = warnings
    assert "capture was on (agl-otel (opentelemetry-instrument))" in warning
    assert f"e.g. rollout {rollout.rollout_id}" in warning
    assert "an instrumentor that failed to load" in warning and "opentelemetry-util-genai" in warning
    assert "a misspelled switch" in warning and "OTEL_SDK_DISABLED" in warning

    export = agl_export(store, tmp_path)
    assert export.returncode == 0, export.stderr
    assert "0 calls joined to their span by id, 0 by order, 2 unjoined (no LLM span)" in export.stderr
    assert f"1 rollouts had gateway calls and no LLM span joined (e.g. {rollout.rollout_id})" in export.stderr


@pytest.mark.timeout(300)
def test_a_misspelled_switch_is_named_when_its_rollout_has_no_span(rig, tmp_path):
    """``AGL_LANGCHAIN_INSTRUMNT=1``: agl-langchain's ``.pth`` file never sees its switch."""
    store, gateway = rig
    done = agl_run(store, gateway, tmp_path, launcher=False, AGL_LANGCHAIN_INSTRUMNT="1")
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if line.startswith("agl run: warning:")]
    assert warning.startswith(
        "agl run: warning: capture was on ($AGL_LANGCHAIN_INSTRUMNT (agl reads no such variable; "
        "did you mean $AGL_LANGCHAIN_INSTRUMENT?)) but 1 finished rollout(s) with gateway calls had no LLM span"
    )


@pytest.mark.timeout(300)
def test_no_capture_switched_on_says_nothing(rig, tmp_path):
    store, gateway = rig
    done = agl_run(store, gateway, tmp_path, launcher=False)
    assert done.returncode == 0, done.stderr
    assert len(list(store.query_llm_calls())) == 2
    assert "warning" not in done.stderr, done.stderr  # calls with no spans are what a plain agent records


@pytest.mark.timeout(300)
def test_an_unknown_agl_variable_is_warned_about_once_by_each_process(rig, tmp_path):
    """``agl run`` (the CLI) and the agent under ``opentelemetry-instrument`` (agl-otel's
    instrumentor) each read the environment, so each warns once about ``AGL_STORE_ULR``; the run
    itself is unchanged: both calls joined."""
    store, gateway = rig
    done = agl_run(store, gateway, tmp_path, AGL_STORE_ULR="sqlite:///elsewhere.db")
    line = "$AGL_STORE_ULR is set but agl reads no such variable; did you mean $AGL_STORE_URL?"
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(line) == 2, done.stderr
    assert [w for w in done.stderr.splitlines() if "warning" in w.lower() and line not in w] == []
    (rollout,) = store.query_rollouts()
    assert len(list(store.query_spans(rollout_ids=[rollout.rollout_id], kind="llm"))) == 2


@pytest.mark.timeout(300)
def test_the_capture_check_waits_for_a_gateway_that_records_late(sqlite_store, tmp_path):
    """The gateway answers first and writes its record later: here 2 s later (its writer's interval),
    past the child's exit, as a loaded host makes it. The check still finds the calls and warns."""
    from agl.capture import BufferedWriter
    from agl_trainer.gateway.server import Gateway
    from tests.fake_engine import FakeEngine

    with FakeEngine() as engine:
        writer = BufferedWriter(sqlite_store, interval_s=2.0)
        gateway = Gateway(sqlite_store, [engine.url], token="t", admin_token="a", writer=writer).start()
        try:
            done = agl_run(sqlite_store, gateway, tmp_path, launcher=False, AGL_LANGCHAIN_INSTRUMNT="1")
        finally:
            gateway.stop()
            writer.close()
    assert done.returncode == 0, done.stderr
    assert "agl run: warning: capture was on ($AGL_LANGCHAIN_INSTRUMNT" in done.stderr, done.stderr
