"""agl-otel on an OpenTelemetry SDK outside its range: a clear warning, or with AGL_STRICT_VERSIONS an error."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings

import pytest
from opentelemetry.sdk.trace import TracerProvider

from agl.capture import versions
from agl.capture.versions import UnsupportedVersionError, UntestedVersionWarning
from agl.env import STRICT_VERSIONS
from agl_otel import AglInstrumentor, AglSpanProcessor
from tests.versions import fake_installed_version

instrument_module = importlib.import_module("agl_otel.instrument")


def _fake(monkeypatch, version: str) -> None:
    fake_installed_version(monkeypatch, "opentelemetry-sdk", version)


@pytest.fixture
def instrumentor(monkeypatch):
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)
    inst = AglInstrumentor()
    inst.uninstrument()
    yield inst
    inst.uninstrument()


def test_tested_range_holds_the_installed_sdk():
    assert instrument_module.TESTED == "opentelemetry-sdk>=1.30,<2"
    assert versions.satisfies(importlib.metadata.version("opentelemetry-sdk"), instrument_module.TESTED)


def test_inside_the_range_instrument_works_without_a_warning(instrumentor):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedVersionWarning)
        instrumentor.instrument(tracer_provider=TracerProvider())
    assert isinstance(instrumentor.processor, AglSpanProcessor)


def test_outside_the_range_instrument_warns_and_still_adds_the_processor(monkeypatch, instrumentor):
    _fake(monkeypatch, "2.0.0")
    with pytest.warns(UntestedVersionWarning) as caught:
        instrumentor.instrument(tracer_provider=TracerProvider())
    assert isinstance(instrumentor.processor, AglSpanProcessor)
    message = str(caught[0].message)
    assert "opentelemetry-sdk 2.0.0 is installed" in message
    assert "tested with opentelemetry-sdk>=1.30,<2" in message


def test_outside_the_range_strict_raises(monkeypatch, instrumentor):
    _fake(monkeypatch, "2.0.0")
    monkeypatch.setenv(STRICT_VERSIONS, "1")
    with pytest.raises(UnsupportedVersionError, match=r"opentelemetry-sdk 2\.0\.0 is installed"):
        instrumentor.instrument(tracer_provider=TracerProvider())
    assert not instrumentor.is_instrumented_by_opentelemetry
