"""Fixtures for agl-otel: a real OpenTelemetry SDK tracer provider with agl's processor, and a gateway."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agl_otel import AglSpanProcessor
from agl_trainer.gateway import Gateway
from tests.fake_engine import FakeEngine


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


@pytest.fixture
def rig(sqlite_store):
    """A SQLite store and a started gateway in front of the fake engine, for ``agl run`` to run agents against."""
    with FakeEngine() as engine:
        gateway = Gateway(sqlite_store, [engine.url], token="t", admin_token="a", model_version="v1").start()
        try:
            yield sqlite_store, gateway
        finally:
            gateway.stop()
