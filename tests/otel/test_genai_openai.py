"""agl-otel with the real opentelemetry-instrumentation-genai-openai around the openai client."""

from __future__ import annotations

import openai
import pytest
from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor

import agl


@pytest.fixture
def instrumented_openai(provider, monkeypatch):
    # OpenTelemetry's own switches for message content on spans (see the package README).
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()


def test_chat_calls_join_the_gateway_by_response_id(gateway_rollout, instrumented_openai):
    rig = gateway_rollout
    tracer = instrumented_openai.get_tracer("my-agent")
    client = openai.OpenAI(base_url=rig.base_url, api_key=rig.key, max_retries=0)  # the rollout's own key
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    with tracer.start_as_current_span(
        "invoke_agent planner", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"}
    ):
        first = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "call lookup"}], tools=tools
        )
        second = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "thanks"}], max_tokens=64
        )
    agl.emit_reward(1.0)

    llm = rig.spans("llm")
    calls = rig.calls()
    assert [s.attributes["gen_ai.response.id"] for s in llm] == [first.id, second.id] == [c.call_id for c in calls]
    assert all(s.attributes["gen_ai.agent.name"] == "planner" for s in llm)  # inherited from the enclosing agent span
    assert llm[0].attributes["gen_ai.request.model"] == "gpt-4o"
    assert llm[1].attributes["gen_ai.request.max_tokens"] == 64
    # Message content is on the span (JSON text there), parsed back into structures here.
    assert llm[1].attributes["gen_ai.input.messages"][0]["parts"][0]["content"] == "thanks"
    assert llm[1].attributes["gen_ai.output.messages"][0]["parts"][0]["content"] == "echo: thanks"
    assert llm[0].attributes["gen_ai.usage.input_tokens"] == len(calls[0].prompt_ids)
    (agent_span,) = rig.spans("agent")
    assert {s.parent_id for s in llm} == {agent_span.span_id}
    # The in-memory exporter saw the same spans: agl's processor sits beside the user's.
    assert len(instrumented_openai.exporter.get_finished_spans()) == 3

    transitions, report = rig.transitions()
    assert report.joined_by_id == 2
    assert [t.agent for t in transitions] == ["planner", "planner"]
    assert {t.token_source for t in transitions} == {"engine"}


INSTRUMENT_IN_CODE = """
import sys
import agl, agl_otel
from agl.capture import BufferedWriter, RolloutContext
from agl.store.sqlite import SqliteStore
from opentelemetry import trace

store = SqliteStore(sys.argv[1])
writer = BufferedWriter(store)
assert not agl_otel.instrumented()
processor = agl_otel.instrument()
assert agl_otel.instrument() is processor and agl_otel.instrumented()
tracer = trace.get_tracer("my-agent")
for rollout in ("ro-on", "ro-off"):
    with agl.use_rollout(RolloutContext(rollout_id=rollout, writer=writer)):
        with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}):
            pass
    agl_otel.uninstrument()
assert not agl_otel.instrumented()
writer.close()
print([(s.rollout_id, s.kind) for s in store.query_spans()])
"""


def test_instrument_in_code_uses_the_global_tracer_provider(tmp_path):
    """agl_otel.instrument() with no provider configured: it installs one, captures, and stops on uninstrument()."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", INSTRUMENT_IN_CODE, str(tmp_path / "agl.db")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('ro-on', 'llm')]"
