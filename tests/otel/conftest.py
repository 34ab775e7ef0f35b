"""Fixtures for agl-otel: a real OpenTelemetry SDK tracer provider with agl's processor."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agl_otel import AglSpanProcessor


@pytest.fixture
def provider():
    """A tracer provider (not the global one) exporting to memory and to agl."""
    tp = TracerProvider()
    exporter = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tp.add_span_processor(AglSpanProcessor())
    tp.exporter = exporter
    yield tp
    tp.shutdown()


@pytest.fixture
def gateway_rollout(sqlite_store):
    from tests.autogen.gateway_rig import gateway_rollout as rig

    with rig(sqlite_store) as r:
        yield r
