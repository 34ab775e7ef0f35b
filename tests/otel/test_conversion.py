"""OpenInference spans, the OTLP/HTTP endpoint on the store server, and the instrumentor."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import agl
from agl.capture import BufferedWriter, RolloutContext
from agl_trainer.store_server import ServerThread


def test_openinference_llm_and_tool_spans(provider, sqlite_store):
    writer = BufferedWriter(sqlite_store)
    tracer = provider.get_tracer("phoenix-style")
    with agl.use_rollout(RolloutContext(rollout_id="ro-oi", writer=writer)):
        with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT", "agent.name": "researcher"}):
            with tracer.start_as_current_span("ChatCompletion", attributes={
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-mini",
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "be brief",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.content": "weather?",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "lookup",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"city": "Oslo"}',
                "llm.token_count.prompt": 12,
                "llm.token_count.completion": 5,
                "output.value": json.dumps({"id": "chatcmpl-42", "choices": []}),
            }):
                pass
            with tracer.start_as_current_span("lookup", attributes={
                "openinference.span.kind": "TOOL", "tool.name": "lookup",
                "input.value": '{"city": "Oslo"}', "output.value": "rain",
            }):
                pass
        with tracer.start_as_current_span("plain http span", attributes={"http.method": "GET"}):
            pass
    writer.close()

    spans = list(sqlite_store.query_spans(rollout_id="ro-oi"))
    assert [s.kind for s in spans] == ["llm", "tool", "agent"]  # the plain span is not agl's business
    llm, tool, agent = spans
    assert llm.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert llm.attributes["gen_ai.input.messages"] == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "weather?"}]},
    ]
    assert llm.attributes["gen_ai.output.messages"] == [
        {"role": "assistant", "parts": [{"type": "tool_call", "name": "lookup", "arguments": '{"city": "Oslo"}'}]}
    ]
    assert llm.attributes["gen_ai.usage.input_tokens"] == 12
    assert llm.attributes["gen_ai.response.id"] == "chatcmpl-42"
    assert llm.attributes["gen_ai.agent.name"] == "researcher"
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.tool.call.result"] == "rain"
    assert llm.parent_id == tool.parent_id == agent.span_id


def test_otlp_endpoint_takes_protobuf_and_json(sqlite_store):
    with ServerThread(sqlite_store, token="s3cret") as server:
        # A real OTLP/HTTP protobuf exporter, as an out-of-process agent would configure it.
        tp = TracerProvider(resource=Resource.create({"agl.rollout_id": "ro-otlp", "service.name": "agent"}))
        exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": "Bearer s3cret"})
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = tp.get_tracer("remote")
        with tracer.start_as_current_span("chat gpt-4o", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.id": "chatcmpl-remote", "gen_ai.usage.input_tokens": 9,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}]),
        }):
            pass
        with tracer.start_as_current_span("unrelated"):
            pass
        tp.shutdown()

        body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "execute_tool lookup",
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            "status": {"code": 1},
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
                {"key": "agl.rollout_id", "value": {"stringValue": "ro-otlp"}},
                {"key": "attempt", "value": {"intValue": "2"}},
            ]}]}]}]}
        ok = httpx.post(f"{server.url}/v1/traces", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200, ok.text
        denied = httpx.post(f"{server.url}/v1/traces", json=body)
        assert denied.status_code == 401
        bad = httpx.post(f"{server.url}/v1/traces", content=b"\x00not protobuf", headers={
            "Authorization": "Bearer s3cret", "Content-Type": "application/x-protobuf"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "body"

    spans = list(sqlite_store.query_spans(rollout_id="ro-otlp"))
    assert [(s.kind, s.name) for s in spans] == [("llm", "chat gpt-4o"), ("tool", "execute_tool lookup")]
    llm, tool = spans
    assert llm.attributes["gen_ai.response.id"] == "chatcmpl-remote"
    assert llm.attributes["gen_ai.output.messages"][0]["parts"][0]["content"] == "hi"
    assert tool.span_id == "eee19b7ec3c1b174" and tool.status == "ok"
    assert tool.attributes["attempt"] == 2
    assert tool.end_time - tool.start_time == 1.0


def test_instrumentor_is_registered_and_adds_the_processor(sqlite_store):
    (ep,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "agl"]
    instrumentor = ep.load()()
    tp = TracerProvider()
    instrumentor.instrument(tracer_provider=tp)
    writer = BufferedWriter(sqlite_store)
    with agl.use_rollout(RolloutContext(rollout_id="ro-inst", writer=writer)):
        with tp.get_tracer("x").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}):
            pass
    instrumentor.uninstrument()
    with agl.use_rollout(RolloutContext(rollout_id="ro-inst", writer=writer)):
        with tp.get_tracer("x").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}):
            pass
    writer.close()
    assert [s.kind for s in sqlite_store.query_spans(rollout_id="ro-inst")] == ["llm"]
