"""agl for any OpenTelemetry-instrumented agent.

- :class:`AglSpanProcessor`: in-process, turns GenAI / OpenInference spans into agl spans;
- :class:`AglInstrumentor`: the same through ``opentelemetry-instrument``;
- ``POST /v1/traces`` on ``agl store serve`` (an agl plugin) for out-of-process exporters.
"""

from agl_otel._guard import errors
from agl_otel.convert import to_agl
from agl_otel.instrumentor import AglInstrumentor
from agl_otel.processor import AglSpanProcessor

__all__ = ["AglInstrumentor", "AglSpanProcessor", "errors", "to_agl"]
