"""agl for any OpenTelemetry-instrumented agent.

- :class:`AglSpanProcessor`: in-process, turns GenAI / OpenInference spans into agl spans;
- :class:`AglInstrumentor` / :func:`instrument`: the same through ``opentelemetry-instrument`` or one call;
- ``POST /v1/traces`` on ``agl store serve`` (an agl plugin) for out-of-process exporters.
"""

from agl.capture import error_guard
from agl_otel.convert import to_agl
from agl_otel.instrument import AglInstrumentor, instrument, instrumented, uninstrument
from agl_otel.processor import AglSpanProcessor

__version__ = "0.1.0"

errors = error_guard("agl_otel").errors
"""agl's own failures swallowed so far, by place (see :class:`agl.capture.ErrorGuard`)."""

__all__ = ["AglInstrumentor", "AglSpanProcessor", "errors", "instrument", "instrumented", "to_agl", "uninstrument"]
