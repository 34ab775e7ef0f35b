"""The OTLP/HTTP traces endpoint (``POST /v1/traces``) that :mod:`agl_otel.plugin` mounts on ``agl store serve``.

Point any OpenTelemetry exporter at the store server::

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4317/v1/traces
    OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer <store token>"
    OTEL_RESOURCE_ATTRIBUTES=agl.rollout_id=<rollout id>     # or none: production traces

Bodies are protobuf (``application/x-protobuf``) or JSON (``application/json``),
optionally gzip-compressed; GenAI and OpenInference spans are stored as agl spans,
other spans are accepted and dropped.
"""

from __future__ import annotations

import gzip
import json
import logging

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agl_otel import otlp

log = logging.getLogger("agl_otel")

_PROTOBUF = "application/x-protobuf"


def _error(reason: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"type": "BadRequest", "field": "body", "reason": reason}}, status_code=status)


def traces_route(store) -> Route:
    """The ``POST /v1/traces`` route storing into ``store``."""

    async def export(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding", "").lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except OSError as exc:
                return _error(f"not valid gzip: {exc}")
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            if content_type == "application/json":
                spans = list(otlp.from_json(json.loads(body)))
            elif content_type in (_PROTOBUF, "application/protobuf", ""):
                spans = list(otlp.from_protobuf(body))
            else:
                return _error(f"content-type {content_type!r}: use application/x-protobuf or application/json", 415)
        except Exception as exc:
            return _error(f"not an OTLP ExportTraceServiceRequest: {exc}")
        if spans:
            await anyio.to_thread.run_sync(store.add_spans, spans)
        if content_type == "application/json":
            return JSONResponse({"partialSuccess": {}})
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=_PROTOBUF)

    return Route("/v1/traces", export, methods=["POST"])
