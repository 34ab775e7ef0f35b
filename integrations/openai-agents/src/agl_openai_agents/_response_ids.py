"""Response ids for the Chat Completions path, which the SDK's generation spans leave out.

``OpenAIChatCompletionsModel`` keeps the ``ChatCompletion`` (and, streamed, the
chunks) to itself: its generation span has the messages but not the completion
id. A wrapper around its ``_fetch_response`` (the one place that holds both the
span and the response; checked against openai-agents 0.24) notes the id under
the generation span's id, and the processor picks it up when the span ends.
"""

from __future__ import annotations

import functools
from typing import Any

from agl.capture import error_guard
from agl.capture.patching import Patches
from agl_openai_agents._notes import SpanNotes

_guard = error_guard("agl_openai_agents")

_ids: SpanNotes[str] = SpanNotes()
note = _ids.note  # keep a response id for its generation span's id
pop = _ids.pop  # the response id noted for a span id, forgotten


class _IdTap:
    """An async chunk stream that notes the first chunk's id and passes everything on."""

    def __init__(self, stream: Any, span_id: str):
        self._stream = stream
        self._span_id = span_id

    def __aiter__(self) -> Any:
        return self._iterate()

    async def _iterate(self) -> Any:
        noted = False
        async for chunk in self._stream:
            if not noted and getattr(chunk, "id", None):
                noted = True
                note(self._span_id, chunk.id)
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _chat_completions_model() -> type:
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    return OpenAIChatCompletionsModel


def _noting_ids(original: Any) -> Any:
    @functools.wraps(original)
    async def _fetch_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, *args, **kwargs)
        try:
            span = kwargs["span"] if "span" in kwargs else args[6]
            span_id = getattr(span, "span_id", None)
            if span_id:
                if isinstance(result, tuple) and len(result) == 2:
                    return result[0], _IdTap(result[1], span_id)
                response_id = getattr(result, "id", None)
                if isinstance(response_id, str):
                    note(span_id, response_id)
        except Exception as exc:
            _guard.report("chat completions response id", exc)
        return result

    return _fetch_response


_patches = Patches()


def install() -> None:
    """Wrap ``OpenAIChatCompletionsModel._fetch_response`` (idempotent)."""
    if not _patches:
        _patches.wrap(_chat_completions_model(), "_fetch_response", _noting_ids)


def uninstall() -> None:
    """Put the original ``_fetch_response`` back (idempotent)."""
    _patches.undo()
