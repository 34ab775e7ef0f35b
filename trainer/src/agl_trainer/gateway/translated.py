"""Serving an API the gateway translates to the engine's chat interface (Responses, Anthropic Messages).

The request has become a chat request already; :func:`serve` answers the client from
the engine's chat answer in the other API's shape and records the call with the chat
answer's token ids, exactly as a chat completion is recorded. What differs per API is
given as :class:`Translators`: a function turning a whole chat completion into the API's
response, and an :class:`EventTranslator` turning a chat stream into the API's events as
it arrives. :class:`TranslatedDialect` is the part of such an API's
:class:`~agl_trainer.gateway.dialect.Dialect` that is the same for both.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import NamedTuple, Protocol

from agl_trainer.gateway import json_codec
from agl_trainer.gateway.chat import StreamAccumulator, engine_json, take_chat_tokens, upstream_chat_request
from agl_trainer.gateway.dialect import OpenAIErrors
from agl_trainer.gateway.errors import server_error
from agl_trainer.gateway.recorder import CallMeta, Recorder
from agl_trainer.gateway.sse import iter_engine_chunks
from agl_trainer.gateway.upstream import UpstreamResponse
from agl_trainer.http import SSE_HEADERS

log = logging.getLogger(__name__)


class EventTranslator(Protocol):
    """Chat stream chunks in, another API's stream events out (each as encoded SSE bytes)."""

    def start(self) -> list[bytes]:
        """The events before the first chunk."""

    def feed(self, chunk: dict) -> list[bytes]:
        """The events one engine chunk makes."""

    def finish(self, usage: dict | None) -> list[bytes]:
        """The closing events, once the engine's stream has ended (``usage``: its chat usage)."""

    def failed(self, message: str) -> bytes:
        """The event that ends a stream the engine dropped, telling the client ``message``."""

    @property
    def result(self) -> dict:
        """The response the stream adds up to (what gets recorded)."""


class Translators(NamedTuple):
    """One API's answers: ``answer(chat_completion)`` is the non-streamed response, ``events()``
    makes the translator of a streamed one."""

    answer: Callable[[dict], dict]
    events: Callable[[], EventTranslator]


async def serve(
    recorder: Recorder, meta: CallMeta, req: dict, upstream: UpstreamResponse, send: Callable, api: Translators
) -> None:
    """Answer from the engine's chat answer ``upstream`` (status 200) in ``api``'s shape and record the call."""
    answer, events = api
    if not req.get("stream"):
        chat = engine_json(await upstream.read())
        prompt_ids, tokens = take_chat_tokens(chat, keep_ids=False, keep_logprobs=False)
        response = answer(chat)
        payload = json_codec.dump(response)
        recorder.record(meta, prompt_ids, tokens[:1], response)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        return
    stream = events()
    acc = StreamAccumulator(chat=True)
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    opening = b"".join(stream.start())
    if opening:
        await send({"type": "http.response.body", "body": opening, "more_body": True})
    try:
        async for chunk in iter_engine_chunks(upstream):
            acc.feed(chunk)
            out = stream.feed(chunk)
            if out:
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
    except ConnectionError as exc:
        hidden = server_error(502, "the engine dropped the stream", str(exc))  # no engine URL for the client
        await send({"type": "http.response.body", "body": stream.failed(hidden.message), "more_body": False})
        log.warning("gateway: stream of %s cut short, not recorded: %s", meta.call_id, exc)
        return
    await send({"type": "http.response.body", "body": b"".join(stream.finish(acc.usage)), "more_body": False})
    prompt_ids, tokens = acc.tokens()
    recorder.record(meta, prompt_ids, tokens[:1], stream.result)


class TranslatedDialect(OpenAIErrors, abc.ABC):
    """What a translated API's :class:`~agl_trainer.gateway.dialect.Dialect` shares: calls go to the
    engine's chat interface and are answered through :func:`serve`; errors are OpenAI's unless a
    subclass says otherwise. A subclass names its ``endpoint`` and ``id_prefix`` and gives
    :meth:`engine_request` and :meth:`translators`."""

    endpoint: str
    id_prefix: str
    engine_path = "/chat/completions"

    @abc.abstractmethod
    def engine_request(self, req: dict) -> dict:
        """The engine's chat request for the API's request ``req``."""

    @abc.abstractmethod
    def translators(self, meta: CallMeta, req: dict, model: str | None) -> Translators:
        """How to answer ``req`` from the engine's chat answer, showing ``model``."""

    @staticmethod
    def upstream(engine_req: dict, model: str | None, cap: int | None) -> dict:
        return upstream_chat_request(engine_req, model, cap)

    async def answer(
        self, recorder: Recorder, meta: CallMeta, req: dict, resp: UpstreamResponse, model: str | None, send: Callable
    ) -> None:
        await serve(recorder, meta, req, resp, send, self.translators(meta, req, model))
