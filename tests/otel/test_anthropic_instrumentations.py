"""Anthropic-SDK agents under ``agl run`` + ``opentelemetry-instrument``: each call's LLM span joins
the gateway's record of it by response id (``msg_...``).

Everything is real, as in test_agl_run.py: the gateway in front of tests/fake_engine.py, a SQLite
store, ``agl run`` and ``agl export`` as commands, the ``anthropic`` SDK, and each instrumentation
from the package index: OpenLLMetry's opentelemetry-instrumentation-anthropic (``gen_ai.response.id``
on the span) and OpenInference's openinference-instrumentation-anthropic (the response id inside
the ``output.value`` JSON).

Both register the ``opentelemetry_instrumentor`` entry point ``anthropic``, and this environment
has both, so ``opentelemetry-instrument`` would load the two together: here it is told to load
neither (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=anthropic``; it still sets up the SDK and agl's
processor) and the agent instruments the one under test in code, as each package's README shows.
The ``anthropic`` SDK also traces its own calls whenever OpenTelemetry is there; those spans are
switched off (``ANTHROPIC_OPEN_TELEMETRY=false``) next to an instrumentation, since two LLM spans
of one call would make the second a text-only transition, and tested on their own.
"""

from __future__ import annotations

import json

import pytest

from tests.otel.test_agl_run import agl_export, agl_run, clean_run

CALLS = """
from anthropic import Anthropic

client = Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from agl run
client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "first?"}])
stream = client.messages.create(
    model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "second?"}], stream=True
)
for event in stream:
    pass
with client.messages.stream(
    model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "third?"}]
) as stream:
    stream.get_final_message()
"""

INSTRUMENT = {
    "openllmetry": "from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor\n",
    "openinference": "from openinference.instrumentation.anthropic import AnthropicInstrumentor\n",
}


def run_and_export(rig, tmp_path, agent: str, **child_env: str):
    """Run ``agent`` under ``agl run``, check its three calls joined by id, and return the LLM spans by call id."""
    store, gateway = rig
    done = agl_run(
        store, gateway, tmp_path, agent=agent, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="anthropic", **child_env
    )
    _, calls, spans = clean_run(store, done)
    assert len(calls) == 3 and all(c.call_id.startswith("msg_") for c in calls)
    by_id = {s.attributes.get("gen_ai.response.id"): s for s in spans}
    assert len(spans) == 3 and sorted(by_id) == sorted(c.call_id for c in calls), [s.attributes for s in spans]

    export = agl_export(store, tmp_path)
    assert export.returncode == 0, export.stderr
    assert "3 calls joined to their span by id, 0 by order, 0 unjoined (no LLM span), 0 text-only" in export.stderr
    transitions = [json.loads(line) for line in (tmp_path / "transitions.jsonl").read_text().splitlines()]
    assert sorted(t["call_id"] for t in transitions) == sorted(by_id)
    assert {t["token_source"] for t in transitions} == {"engine"}
    return by_id


@pytest.mark.timeout(300)
@pytest.mark.parametrize("instrumentation", sorted(INSTRUMENT))
def test_each_instrumentation_joins_every_call_streamed_or_not_by_response_id(rig, tmp_path, instrumentation):
    agent = INSTRUMENT[instrumentation] + "AnthropicInstrumentor().instrument()\n" + CALLS
    spans = run_and_export(rig, tmp_path, agent, ANTHROPIC_OPEN_TELEMETRY="false")
    answers = [s.attributes["gen_ai.output.messages"][0]["parts"] for s in spans.values()]
    assert sorted(answers, key=str) == [
        [{"type": "text", "content": f"echo: {q}?"}] for q in ("first", "second", "third")
    ]
    for response_id, span in spans.items():
        assert span.attributes["gen_ai.provider.name"] == "anthropic"
        if instrumentation == "openinference":  # the id was read out of the raw response it records
            assert span.attributes["agl.openinference.span_kind"] == "LLM"
            assert json.loads(span.attributes["agl.output"])["id"] == response_id
        else:
            assert span.name == "anthropic.chat" and span.attributes["gen_ai.operation.name"] == "chat"


@pytest.mark.timeout(300)
def test_the_sdks_own_spans_join_with_no_instrumentation(rig, tmp_path):
    spans = run_and_export(rig, tmp_path, CALLS)
    assert {s.name for s in spans.values()} == {"anthropic.messages.create"}  # messages.stream calls create
