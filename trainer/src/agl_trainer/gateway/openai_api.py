"""OpenAI's chat and text completions (``/v1/chat/completions``, ``/v1/completions``): the engine's own API.

The request goes to the engine as the client sent it, asking for token ids and logprobs too
(:mod:`agl_trainer.gateway.chat`); the answer comes back with the gateway's id (``chatcmpl-...``,
``cmpl-...``), the model name the client asked for, and without the token-id extras unless the
client asked for them itself. A stream is relayed chunk by chunk as it arrives (its usage chunk
only when ``stream_options.include_usage`` asks for it) and recorded once it has ended; a stream
the engine drops ends with an error event and is not recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agl_trainer.gateway import chat, json_codec, validate
from agl_trainer.gateway.dialect import OpenAIErrors
from agl_trainer.gateway.endpoints import send_json
from agl_trainer.gateway.errors import server_error
from agl_trainer.gateway.recorder import CallMeta, Recorder
from agl_trainer.gateway.sse import iter_engine_chunks
from agl_trainer.gateway.upstream import UpstreamResponse
from agl_trainer.http import DONE_EVENT, SSE_HEADERS, data_event

log = logging.getLogger(__name__)


class OpenAICompletions(OpenAIErrors):
    """Chat completions (``is_chat``) or text completions: the :class:`~agl_trainer.gateway.dialect.Dialect`
    of the engine's own API."""

    def __init__(self, *, is_chat: bool):
        self.is_chat = is_chat
        self.endpoint = "chat.completions" if is_chat else "completions"
        self.id_prefix = "chatcmpl-" if is_chat else "cmpl-"
        self.engine_path = "/chat/completions" if is_chat else "/completions"
        self._check = validate.check_chat if is_chat else validate.check_completion
        self._upstream = chat.upstream_chat_request if is_chat else chat.upstream_completion_request
        self._take = chat.take_chat_tokens if is_chat else chat.take_completion_tokens

    def engine_request(self, req: dict) -> dict:
        self._check(req)
        return req

    def upstream(self, engine_req: dict, model: str | None, cap: int | None) -> dict:
        return self._upstream(engine_req, model, cap)

    async def answer(
        self, recorder: Recorder, meta: CallMeta, req: dict, resp: UpstreamResponse, model: str | None, send: Callable
    ) -> None:
        if req.get("stream"):
            await self._relay_stream(recorder, meta, req, resp, model, send)
        else:
            await self._answer(recorder, meta, req, await resp.read(), send)

    async def _answer(self, recorder: Recorder, meta: CallMeta, req: dict, raw: bytes, send: Callable) -> None:
        data = chat.engine_json(raw)
        keep_ids, keep_logprobs = chat.client_wants(req, chat=self.is_chat)
        prompt_ids, tokens = self._take(data, keep_ids=keep_ids, keep_logprobs=keep_logprobs)
        data["id"] = meta.call_id
        if meta.requested_model:
            data["model"] = meta.requested_model
        recorder.tell(data, meta)
        payload = json_codec.dump(data)
        recorder.record(meta, prompt_ids, tokens, data)
        await send_json(send, 200, payload)

    async def _relay_stream(
        self, recorder: Recorder, meta: CallMeta, req: dict, resp: UpstreamResponse, model: str | None, send: Callable
    ) -> None:
        keep_ids, keep_logprobs = chat.client_wants(req, chat=self.is_chat)
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        acc = chat.StreamAccumulator(self.is_chat)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        try:
            async for chunk in iter_engine_chunks(resp):
                recorder.tell(chunk, meta)
                acc.feed(chunk)
                chunk["id"] = meta.call_id
                if model:
                    chunk["model"] = model
                chat.strip_chunk(chunk, keep_ids=keep_ids, keep_logprobs=keep_logprobs)
                if not include_usage:
                    if not chunk.get("choices") and chunk.get("usage"):
                        continue
                    chunk.pop("usage", None)
                await send({"type": "http.response.body", "body": data_event(chunk), "more_body": True})
        except ConnectionError as exc:
            err = server_error(
                502, "the engine dropped the stream", str(exc), type="upstream_error", code="engine_error"
            ).body()
            await send({"type": "http.response.body", "body": data_event(err), "more_body": False})
            log.warning("gateway: stream of %s cut short, not recorded: %s", meta.call_id, exc)
            return
        await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})
        prompt_ids, tokens = acc.tokens()
        recorder.record(meta, prompt_ids, tokens, acc.response(meta.call_id, model))


CHAT = OpenAICompletions(is_chat=True)
"""``/v1/chat/completions``."""
COMPLETIONS = OpenAICompletions(is_chat=False)
"""``/v1/completions``."""
