"""The request of a Responses API call, for the response spans the SDK leaves without one.

``OpenAIResponsesModel`` sets a response span's ``input`` and ``response`` only once
the call has succeeded: a failed call (an HTTP error, a timeout, a broken stream)
ends with an error span holding neither, so neither its response id nor its prompt
could join it to the gateway's record of the same call. A wrapper around
``_fetch_response`` (checked against openai-agents 0.24) notes the model,
instructions and input under the current response span's id before the request
goes out; the processor takes them when the span ends and uses them where the
span has none.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from agl.capture import error_guard
from agl.capture.patching import Patches
from agl_openai_agents._notes import SpanNotes

_guard = error_guard("agl_openai_agents")


@dataclass(frozen=True, slots=True)
class Request:
    """What a Responses API call asked for."""

    model: str | None
    instructions: str | None
    input: Any


_requests: SpanNotes[Request] = SpanNotes()
note = _requests.note  # keep a request for its response span's id
pop = _requests.pop  # the request noted for a span id, forgotten


def _current_response_span_id() -> str | None:
    from agents.tracing import get_current_span
    from agents.tracing.span_data import ResponseSpanData

    span = get_current_span()
    if span is None or not isinstance(span.span_data, ResponseSpanData):
        return None
    return span.span_id


def _note_call(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    span_id = _current_response_span_id()
    if span_id is None:
        return
    instructions = kwargs["system_instructions"] if "system_instructions" in kwargs else (args[0] if args else None)
    items = kwargs["input"] if "input" in kwargs else (args[1] if len(args) > 1 else None)
    name = getattr(model, "model", None)
    note(
        span_id,
        Request(
            model=str(name) if name else None,
            instructions=instructions if isinstance(instructions, str) else None,
            input=list(items) if isinstance(items, list) else items,
        ),
    )


def _responses_model() -> type:
    from agents.models.openai_responses import OpenAIResponsesModel

    return OpenAIResponsesModel


def _noting_requests(original: Any) -> Any:
    @functools.wraps(original)
    async def _fetch_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _note_call(self, args, kwargs)
        except Exception as exc:
            _guard.report("responses request", exc)
        return await original(self, *args, **kwargs)

    return _fetch_response


_patches = Patches()


def install() -> None:
    """Wrap ``OpenAIResponsesModel._fetch_response`` (idempotent)."""
    if not _patches:
        _patches.wrap(_responses_model(), "_fetch_response", _noting_requests)


def uninstall() -> None:
    """Put the original ``_fetch_response`` back (idempotent)."""
    _patches.undo()
