"""Response ids for the Chat Completions path, which the SDK's generation spans leave out.

``OpenAIChatCompletionsModel`` keeps the ``ChatCompletion`` (and, streamed, the
chunks) to itself: its generation span has the messages but not the completion
id. A wrapper around its ``_fetch_response`` (the one place that holds both the
span and the response; checked against openai-agents 0.24) notes the id under
the generation span's id, and the processor picks it up when the span ends.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

from agl.capture import error_guard

_guard = error_guard("agl_openai_agents")

_ids: OrderedDict[str, str] = OrderedDict()
_MAX = 10_000  # spans whose processor never asked (tracing off for that run) age out
_lock = threading.Lock()
_installed: tuple[Any, Any] | None = None


def note(span_id: str, response_id: str) -> None:
    with _lock:
        _ids[span_id] = response_id
        if len(_ids) > _MAX:
            _ids.popitem(last=False)


def pop(span_id: str) -> str | None:
    with _lock:
        return _ids.pop(span_id, None)


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


def install() -> None:
    """Wrap ``OpenAIChatCompletionsModel._fetch_response`` (idempotent)."""
    global _installed
    if _installed is not None:
        return
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    original = OpenAIChatCompletionsModel._fetch_response

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

    OpenAIChatCompletionsModel._fetch_response = _fetch_response  # type: ignore[method-assign]
    _installed = (OpenAIChatCompletionsModel, original)


def uninstall() -> None:
    """Undo :func:`install`."""
    global _installed
    if _installed is None:
        return
    cls, original = _installed
    cls._fetch_response = original
    _installed = None
