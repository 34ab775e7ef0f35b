"""Writing server-sent events: what the gateway and the engines stream to their clients."""

from __future__ import annotations

import json

SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
"""The response headers of an event stream."""
SSE_MEDIA_TYPE = "text/event-stream"
DONE_EVENT = b"data: [DONE]\n\n"
"""The last event of an OpenAI stream."""


def data_event(obj: object) -> bytes:
    """One ``data:`` event carrying ``obj`` as JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def named_event(name: str, obj: object) -> bytes:
    """One event with an ``event:`` name (the Responses API streams these)."""
    return f"event: {name}\n".encode() + data_event(obj)
