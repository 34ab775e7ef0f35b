"""OTLP/HTTP trace export requests (protobuf or JSON) → agl spans.

The rollout of each span is its ``agl.rollout_id`` attribute, else its resource's
``agl.rollout_id`` attribute (``OTEL_RESOURCE_ATTRIBUTES=agl.rollout_id=ro-…``), else
none (a production trace).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from agl.schema import Span

from agl_otel.convert import to_agl

_STATUS = {0: "unset", 1: "ok", 2: "error", "STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}


def _pb_value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def _json_value(value: dict[str, Any]) -> Any:
    for key, inner in value.items():
        if key == "stringValue" or key == "boolValue" or key == "doubleValue":
            return inner
        if key == "intValue":
            return int(inner)
        if key == "arrayValue":
            return [_json_value(v) for v in inner.get("values", [])]
        if key == "kvlistValue":
            return {kv["key"]: _json_value(kv.get("value", {})) for kv in inner.get("values", [])}
        if key == "bytesValue":
            return base64.b64decode(inner).hex()
    return None


def _json_id(value: Any) -> str | None:
    # OTLP/JSON carries ids as hex; some exporters send base64 (protobuf's JSON mapping).
    if not value:
        return None
    text = str(value)
    if len(text) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    return base64.b64decode(text).hex()


def _span(name: str, attrs: dict[str, Any], resource: dict[str, Any], span_id: str, parent: str | None,
          start: int, end: int, status: str) -> Span | None:
    record = to_agl(name=name, attributes=attrs, span_id=span_id, parent_id=parent, start_ns=start, end_ns=end, status=status)
    if record is not None:
        rollout = attrs.get("agl.rollout_id") or resource.get("agl.rollout_id")
        record.rollout_id = str(rollout) if rollout else None
        record.trace_id = str(attrs.get("agl.trace_id") or "") or record.trace_id
    return record


def from_protobuf(body: bytes) -> Iterator[Span]:
    """agl spans of an ``ExportTraceServiceRequest`` in protobuf."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    for rs in request.resource_spans:
        resource = {kv.key: _pb_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {kv.key: _pb_value(kv.value) for kv in s.attributes}
                record = _span(s.name, attrs, resource, s.span_id.hex(), s.parent_span_id.hex() or None,
                               s.start_time_unix_nano, s.end_time_unix_nano, _STATUS.get(s.status.code, "unset"))
                if record is not None:
                    yield record


def from_json(body: dict[str, Any]) -> Iterator[Span]:
    """agl spans of an ``ExportTraceServiceRequest`` in OTLP/JSON."""
    for rs in body.get("resourceSpans") or []:
        resource = {kv["key"]: _json_value(kv.get("value", {})) for kv in (rs.get("resource") or {}).get("attributes", [])}
        for ss in rs.get("scopeSpans") or []:
            for s in ss.get("spans") or []:
                attrs = {kv["key"]: _json_value(kv.get("value", {})) for kv in s.get("attributes", [])}
                span_id = _json_id(s.get("spanId"))
                if span_id is None:
                    raise ValueError("resourceSpans[].scopeSpans[].spans[].spanId: missing")
                record = _span(s.get("name", ""), attrs, resource, span_id, _json_id(s.get("parentSpanId")),
                               int(s.get("startTimeUnixNano") or 0), int(s.get("endTimeUnixNano") or 0),
                               _STATUS.get((s.get("status") or {}).get("code", 0), "unset"))
                if record is not None:
                    yield record
