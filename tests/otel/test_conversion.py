"""OpenInference spans, the OTLP/HTTP endpoint on the store server, and the instrumentor."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import agl
from agl.capture import BufferedWriter, RolloutContext
from agl_otel.convert import to_agl
from agl_trainer.store_server import ServerThread


def test_openinference_llm_and_tool_spans(provider, sqlite_store):
    writer = BufferedWriter(sqlite_store)
    tracer = provider.get_tracer("phoenix-style")
    with agl.use_rollout(RolloutContext(rollout_id="ro-oi", writer=writer)):
        with tracer.start_as_current_span(
            "agent", attributes={"openinference.span.kind": "AGENT", "agent.name": "researcher"}
        ):
            with tracer.start_as_current_span(
                "ChatCompletion",
                attributes={
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
                },
            ):
                pass
            with tracer.start_as_current_span(
                "lookup",
                attributes={
                    "openinference.span.kind": "TOOL",
                    "tool.name": "lookup",
                    "input.value": '{"city": "Oslo"}',
                    "output.value": "rain",
                },
            ):
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


def test_openinference_message_contents_become_text_parts_before_tool_calls():
    """The list form of a message's content (``message.contents``), as OpenInference's Anthropic
    instrumentation records an answer's blocks: text blocks in order, other block types left to ``output.value``."""
    out = "llm.output_messages.0.message"
    span = to_agl(
        name="messages.create",
        attributes={
            "openinference.span.kind": "LLM",
            f"{out}.role": "assistant",
            f"{out}.tool_calls.0.tool_call.function.name": "lookup",
            f"{out}.contents.1.message_content.type": "thinking",
            f"{out}.contents.1.message_content.text": "let me think",
            f"{out}.contents.2.message_content.text": "then this",
            f"{out}.contents.2.message_content.type": "text",
            f"{out}.contents.0.message_content.type": "text",
            f"{out}.contents.0.message_content.text": "first this",
            "output.value": json.dumps({"id": "msg_42", "content": []}),
        },
        span_id="s1",
        parent_id=None,
        start_ns=1,
        end_ns=2,
    )
    assert span is not None and span.kind == "llm" and span.attributes["gen_ai.response.id"] == "msg_42"
    assert span.attributes["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "first this"},
                {"type": "text", "content": "then this"},
                {"type": "tool_call", "name": "lookup"},
            ],
        }
    ]


def test_otlp_endpoint_takes_protobuf_and_json(sqlite_store):
    with ServerThread(sqlite_store, token="s3cret") as server:
        # A real OTLP/HTTP protobuf exporter, as an out-of-process agent would configure it.
        tp = TracerProvider(resource=Resource.create({"agl.rollout_id": "ro-otlp", "service.name": "agent"}))
        exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": "Bearer s3cret"})
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = tp.get_tracer("remote")
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.response.id": "chatcmpl-remote",
                "gen_ai.usage.input_tokens": 9,
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}]
                ),
            },
        ):
            pass
        with tracer.start_as_current_span("unrelated"):
            pass
        tp.shutdown()

        body = {
            "resourceSpans": [
                {
                    "resource": {"attributes": []},
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": "5b8efff798038103d269b633813fc60c",
                                    "spanId": "eee19b7ec3c1b174",
                                    "name": "execute_tool lookup",
                                    "parentSpanId": "b7ad6b7169203331",
                                    "kind": 1,
                                    "flags": 257,
                                    "aFieldFromALaterOtlp": {"x": 1},
                                    "startTimeUnixNano": "1700000000000000000",
                                    "endTimeUnixNano": "1700000001000000000",
                                    "status": {"code": 1},
                                    "attributes": [
                                        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                                        {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
                                        {"key": "agl.rollout_id", "value": {"stringValue": "ro-otlp"}},
                                        {"key": "attempt", "value": {"intValue": "2"}},
                                    ],
                                }
                            ]
                        }
                    ],
                }
            ]
        }
        ok = httpx.post(f"{server.url}/v1/traces", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200, ok.text
        denied = httpx.post(f"{server.url}/v1/traces", json=body)
        assert denied.status_code == 401
        bad = httpx.post(
            f"{server.url}/v1/traces",
            content=b"\x00not protobuf",
            headers={"Authorization": "Bearer s3cret", "Content-Type": "application/x-protobuf"},
        )
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "body"

    spans = list(sqlite_store.query_spans(rollout_id="ro-otlp"))
    assert [(s.kind, s.name) for s in spans] == [("llm", "chat gpt-4o"), ("tool", "execute_tool lookup")]
    llm, tool = spans
    assert llm.attributes["gen_ai.response.id"] == "chatcmpl-remote"
    assert llm.attributes["gen_ai.output.messages"][0]["parts"][0]["content"] == "hi"
    assert tool.span_id == "eee19b7ec3c1b174" and tool.parent_id == "b7ad6b7169203331" and tool.status == "ok"
    assert tool.attributes["attempt"] == 2
    assert tool.end_time - tool.start_time == 1.0


def _exported_request():
    """What a real SDK's OTLP exporter sends for an agent span holding an LLM span and a failed tool span."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    tp = TracerProvider(resource=Resource.create({"agl.rollout_id": "ro-json", "service.name": "agent"}))
    memory = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("remote")
    with tracer.start_as_current_span(
        "invoke_agent writer", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "writer"}
    ):
        with tracer.start_as_current_span(
            "chat m",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "m",
                "gen_ai.usage.input_tokens": 9,
                "gen_ai.request.temperature": 0.5,
                "gen_ai.request.stop_sequences": ["\\n", "END"],
                "streamed": True,
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool lookup", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
        ) as tool:
            tool.set_status(Status(StatusCode.ERROR, "no such city"))
    tp.shutdown()
    return memory.get_finished_spans(), encode_spans(memory.get_finished_spans())


def _otlp_json(request) -> dict:
    """``request`` in OTLP/JSON: protobuf's JSON mapping, but trace and span ids in hex and enums as integers."""
    import base64

    from google.protobuf.json_format import MessageToDict

    body = MessageToDict(request, use_integers_for_enums=True)
    for rs in body["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return body


def test_otlp_json_and_protobuf_of_one_export_give_the_same_spans():
    from agl_otel.otlp import from_json, from_protobuf

    sdk_spans, request = _exported_request()
    body = _otlp_json(request)
    assert body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] == f"{sdk_spans[0].context.span_id:016x}"
    from_pb = list(from_protobuf(request.SerializeToString()))
    from_js = list(from_json(json.loads(json.dumps(body))))

    def comparable(spans):
        return [s.model_dump(exclude={"trace_id"}) for s in spans]

    assert comparable(from_js) == comparable(from_pb)
    by_name = {s.name: s for s in from_js}
    ids = {s.name: f"{s.context.span_id:016x}" for s in sdk_spans}
    assert set(by_name) == {"invoke_agent writer", "chat m", "execute_tool lookup"}
    agent, llm, tool = by_name["invoke_agent writer"], by_name["chat m"], by_name["execute_tool lookup"]
    assert agent.span_id == ids["invoke_agent writer"] and agent.parent_id is None
    assert llm.parent_id == tool.parent_id == agent.span_id and llm.span_id == ids["chat m"]
    assert all(s.rollout_id == "ro-json" for s in from_js)
    assert tool.status == "error" and llm.status == "unset"
    assert llm.attributes["gen_ai.usage.input_tokens"] == 9 and llm.attributes["gen_ai.request.temperature"] == 0.5
    assert llm.attributes["gen_ai.request.stop_sequences"] == ["\\n", "END"] and llm.attributes["streamed"] is True


def test_otlp_json_takes_base64_ids_enum_names_and_nested_values():
    import base64

    from agl_otel.otlp import from_json

    span_id, parent = bytes.fromhex("eee19b7ec3c1b174"), bytes.fromhex("b7ad6b7169203331")
    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "spanId": base64.b64encode(span_id).decode(),
                                "parentSpanId": base64.b64encode(parent).decode(),
                                "name": "chat m",
                                "startTimeUnixNano": 1700000000000000000,
                                "status": {"code": "STATUS_CODE_ERROR"},
                                "attributes": [
                                    {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                                    {"key": "blob", "value": {"bytesValue": base64.b64encode(b"\x01\xff").decode()}},
                                    {
                                        "key": "meta",
                                        "value": {
                                            "kvlistValue": {
                                                "values": [
                                                    {"key": "n", "value": {"intValue": "3"}},
                                                    {
                                                        "key": "xs",
                                                        "value": {
                                                            "arrayValue": {
                                                                "values": [{"doubleValue": 1.5}, {"boolValue": False}]
                                                            }
                                                        },
                                                    },
                                                ]
                                            }
                                        },
                                    },
                                    {"key": "empty", "value": {}},
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    (span,) = from_json(body)
    assert span.span_id == "eee19b7ec3c1b174" and span.parent_id == "b7ad6b7169203331"
    assert span.status == "error" and span.start_time == 1700000000.0 and span.end_time is None
    assert span.attributes["blob"] == "01ff" and span.attributes["meta"] == {"n": 3, "xs": [1.5, False]}
    assert span.attributes["empty"] is None


def test_bad_otlp_json_is_refused_with_the_reason(sqlite_store):
    from google.protobuf.json_format import ParseError

    from agl_otel.otlp import from_json

    no_id = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "name": "chat m",
                                "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    with pytest.raises(ValueError, match="spanId: missing"):
        list(from_json(no_id))
    with pytest.raises(ParseError, match="startTimeUnixNano"):
        from_json(
            {
                "resourceSpans": [
                    {"scopeSpans": [{"spans": [{"spanId": "eee19b7ec3c1b174", "startTimeUnixNano": "soon"}]}]}
                ]
            }
        )
    with ServerThread(sqlite_store, token="s3cret") as server:
        bad = httpx.post(
            f"{server.url}/v1/traces", json={"resourceSpans": "not a list"}, headers={"Authorization": "Bearer s3cret"}
        )
        assert bad.status_code == 400 and "resourceSpans" in bad.json()["error"]["reason"]
        missing = httpx.post(f"{server.url}/v1/traces", json=no_id, headers={"Authorization": "Bearer s3cret"})
        assert missing.status_code == 400 and "spanId: missing" in missing.json()["error"]["reason"]
    assert list(sqlite_store.query_spans()) == []


def test_instrumentor_is_registered_and_adds_the_processor(sqlite_store):
    (ep,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "agl"]
    instrumentor = ep.load()()
    tp = TracerProvider()
    instrumentor.instrument(tracer_provider=tp)
    writer = BufferedWriter(sqlite_store)
    with (
        agl.use_rollout(RolloutContext(rollout_id="ro-inst", writer=writer)),
        tp.get_tracer("x").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}),
    ):
        pass
    instrumentor.uninstrument()
    with (
        agl.use_rollout(RolloutContext(rollout_id="ro-inst", writer=writer)),
        tp.get_tracer("x").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat"}),
    ):
        pass
    writer.close()
    assert [s.kind for s in sqlite_store.query_spans(rollout_id="ro-inst")] == ["llm"]
