"""The zero-line integration: ``opentelemetry-instrument python my_agent.py`` captures into agl.

:class:`AglInstrumentor` is registered under the ``opentelemetry_instrumentor``
entry point as ``agl``, so ``opentelemetry-instrument`` (OpenTelemetry's own
zero-code switch) loads it next to the GenAI instrumentations. In code,
:func:`instrument` does the same. agl-otel installs no ``.pth`` file of its own:
a tracer provider set at interpreter start would take the place of the one the
program sets later, so starting OpenTelemetry is left to ``opentelemetry-instrument``.
The contract :func:`instrument`, :func:`uninstrument` and :func:`instrumented` share with
the other integrations is :mod:`agl.capture.integration`'s.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from agl.capture.versions import check_version
from agl.env import warn_unknown
from agl_otel.processor import AglSpanProcessor

TESTED = "opentelemetry-sdk>=1.30,<2"
"""The OpenTelemetry SDK versions agl-otel supports: public API only, so up to the next major."""

INSTRUMENTS = ("opentelemetry-sdk>=1.30,<2",)
"""What :class:`AglInstrumentor` instruments, as OpenTelemetry's dependency check reads it: the SDK, whose
tracer provider takes agl's span processor (the range agl-otel's own dependency on it allows)."""


def check_framework_version() -> bool:
    """Whether the installed SDK is in :data:`TESTED`; outside it warns once (raises with ``AGL_STRICT_VERSIONS=1``).

    Called when :class:`AglInstrumentor` instruments (:func:`instrument`, ``opentelemetry-instrument``).
    """
    return check_version(
        "agl_otel",
        TESTED,
        still_works="whatever of the SDK's public API the new major kept (agl-otel uses no private OpenTelemetry "
        "API); the OTLP/HTTP endpoint on the store server does not use the SDK",
        may_break="AglSpanProcessor, if the SDK's processor interface changed in the new major",
    )


class AglInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Adds an :class:`AglSpanProcessor` to the tracer provider.

    Registered under the ``opentelemetry_instrumentor`` entry point as ``agl``, so
    ``opentelemetry-instrument`` loads it next to the GenAI instrumentations
    (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=agl`` leaves it out). With no SDK tracer
    provider configured it installs one.
    """

    processor: AglSpanProcessor | None = None
    """The processor ``instrument()`` added, None before it ran (or after ``uninstrument()``)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """:data:`INSTRUMENTS`: ``instrument()`` and ``opentelemetry-instrument`` check them before anything else."""
        return INSTRUMENTS

    def _instrument(self, **kwargs: Any) -> None:
        warn_unknown()  # opentelemetry-instrument's start: where the agent's AGL_* variables are read
        check_framework_version()
        provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        if not hasattr(provider, "add_span_processor"):
            from opentelemetry.sdk.trace import TracerProvider

            provider = TracerProvider()
            trace.set_tracer_provider(provider)
            provider = trace.get_tracer_provider()
        self.processor = AglSpanProcessor()
        provider.add_span_processor(self.processor)

    def _uninstrument(self, **kwargs: Any) -> None:
        # The SDK cannot remove a processor: make it idle instead.
        if self.processor is not None:
            self.processor.enabled = False
            self.processor = None


def instrument() -> AglSpanProcessor:
    """Add an :class:`AglSpanProcessor` to the global tracer provider (once) and return it.

    With no SDK tracer provider configured yet, an SDK ``TracerProvider`` is installed.
    A RuntimeError names the conflict when the installed SDK is not one :data:`INSTRUMENTS` allows.
    """
    instrumentor = AglInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    if instrumentor.processor is None:  # OpenTelemetry's dependency check refused (and logged why)
        raise RuntimeError(f"agl_otel.instrument: {get_dependency_conflicts(INSTRUMENTS)}")
    return instrumentor.processor


def uninstrument() -> None:
    """Stop capturing: the processor :func:`instrument` added ignores everything from now on."""
    instrumentor = AglInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def instrumented() -> bool:
    """Whether :func:`instrument` (or ``opentelemetry-instrument``) is in effect."""
    return bool(AglInstrumentor().is_instrumented_by_opentelemetry)
