"""OTLP/HTTP trace export requests (protobuf or JSON) → agl spans.

Both encodings become one ``ExportTraceServiceRequest`` message (OTLP/JSON through
protobuf's JSON parser), and one converter turns its spans into agl spans.

The rollout of each span is its ``agl.rollout_id`` attribute, else its resource's
``agl.rollout_id`` attribute (``OTEL_RESOURCE_ATTRIBUTES=agl.rollout_id=ro-…``), else
none (a production trace).
"""

from __future__ import annotations

import base64
import string
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from agl.schema import Span
from agl_otel.convert import to_agl

_STATUS = {Status.STATUS_CODE_OK: "ok", Status.STATUS_CODE_ERROR: "error"}
_ID_KEYS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
_HEX = frozenset(string.hexdigits)


def from_protobuf(body: bytes) -> Iterator[Span]:
    """agl spans of an ``ExportTraceServiceRequest`` in protobuf."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return _spans(request)


def from_json(body: Mapping[str, Any]) -> Iterator[Span]:
    """agl spans of an ``ExportTraceServiceRequest`` in OTLP/JSON (the request body, decoded from JSON).

    OTLP/JSON is protobuf's JSON mapping except that trace and span ids are hex, not
    base64; ids already in base64 are taken too. Unknown fields are ignored, as the
    OTLP specification asks of receivers.
    """
    request = ExportTraceServiceRequest()
    json_format.ParseDict(_with_base64_ids(body), request, ignore_unknown_fields=True)
    return _spans(request)


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                record = _span(s, resource)
                if record is not None:
                    yield record


def _span(s: OtlpSpan, resource: dict[str, Any]) -> Span | None:
    if not s.span_id:
        raise ValueError("resourceSpans[].scopeSpans[].spans[].spanId: missing")
    attrs = _attributes(s.attributes)
    record = to_agl(
        name=s.name,
        attributes=attrs,
        span_id=s.span_id.hex(),
        parent_id=s.parent_span_id.hex() or None,
        start_ns=s.start_time_unix_nano,
        end_ns=s.end_time_unix_nano,
        status=_STATUS.get(s.status.code, "unset"),
    )
    if record is not None:
        rollout = attrs.get("agl.rollout_id") or resource.get("agl.rollout_id")
        record.rollout_id = str(rollout) if rollout else None
        record.trace_id = str(attrs.get("agl.trace_id") or "") or record.trace_id
    return record


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def _with_base64_ids(body: Mapping[str, Any]) -> Any:
    """A copy of ``body`` whose hex span, parent and trace ids (spans' and links') are base64, as protobuf expects.

    Anything not shaped like a request is left for the protobuf parser to report.
    """
    if not isinstance(body, Mapping):
        return body

    def span(s: Mapping[str, Any]) -> dict[str, Any]:
        out = _base64_ids(s)
        if "links" in out:
            out["links"] = _each(out["links"], _base64_ids)
        return out

    def scope(ss: Mapping[str, Any]) -> dict[str, Any]:
        return {**ss, "spans": _each(ss.get("spans"), span)} if "spans" in ss else dict(ss)

    def resource(rs: Mapping[str, Any]) -> dict[str, Any]:
        key = "scopeSpans" if "scopeSpans" in rs else "scope_spans"
        return {**rs, key: _each(rs.get(key), scope)} if key in rs else dict(rs)

    key = "resourceSpans" if "resourceSpans" in body else "resource_spans"
    return {**body, key: _each(body.get(key), resource)} if key in body else dict(body)


def _each(items: Any, change: Callable[[Mapping[str, Any]], dict[str, Any]]) -> Any:
    if not isinstance(items, list):
        return items
    return [change(item) if isinstance(item, Mapping) else item for item in items]


def _base64_ids(record: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(record)
    for key in _ID_KEYS:
        value = out.get(key)
        if isinstance(value, str) and len(value) in (16, 32) and _HEX.issuperset(value):
            out[key] = base64.b64encode(bytes.fromhex(value)).decode()
    return out
