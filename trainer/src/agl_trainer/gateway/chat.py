"""Chat and text completions: what goes to the engine, what comes back to the client.

Upstream, every request asks for token ids and logprobs and names the model the
replica serves. Back to the client, the answer carries the gateway's response id
and is stripped of the token-id extras unless the client asked for them itself
(``return_token_ids``, ``logprobs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agl_trainer.gateway import json_codec
from agl_trainer.gateway.recorder import (
    LOGPROB_FLOOR,
    TOKEN_ID_EXTRAS,
    ChoiceTokens,
    chat_logprobs,
    completion_logprobs,
    no_ids_error,
)


def _constant(name: str) -> float | None:
    # JSON has no NaN or infinity, but Python's json writes them: -Infinity is the logprob of a
    # token the model cannot pick; the others have no meaning to keep, and become null.
    return LOGPROB_FLOOR if name == "-Infinity" else None


def engine_json(raw: str | bytes) -> Any:
    """An engine's JSON answer, with its non-finite numbers made finite (or null), so the client
    gets strict JSON and the store can keep the record (see :func:`agl.schema.check_json`).

    The value is always what ``json.loads(raw, parse_constant=...)`` gives; pydantic-core's parser
    reads it first, twice as fast (an answer with logprobs is the largest thing the gateway parses:
    issue 46; see :mod:`agl_trainer.gateway.json_codec`)."""
    return json_codec.parse(raw, _constant)


def upstream_chat_request(req: dict, model: str | None, cap: int | None = None) -> dict:
    """The body sent to the engine for a client's chat request (``cap``: the rollout's response cap)."""
    body = dict(req)
    if model:
        body["model"] = model
    if "max_completion_tokens" in body:
        limit = body.pop("max_completion_tokens")
        if body.get("max_tokens") is None:
            body["max_tokens"] = limit
    _cap(body, cap)
    body["return_token_ids"] = True
    body["logprobs"] = True
    if body.get("stream"):
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    else:
        body.pop("stream_options", None)
    return body


def upstream_completion_request(req: dict, model: str | None, cap: int | None = None) -> dict:
    """The body sent to the engine for a client's text completion request (``cap``: the rollout's response cap)."""
    body = dict(req)
    if model:
        body["model"] = model
    _cap(body, cap)
    body["return_token_ids"] = True
    if not body.get("logprobs"):
        body["logprobs"] = 0
    if body.get("stream"):
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    else:
        body.pop("stream_options", None)
    return body


def _cap(body: dict, cap: int | None) -> None:
    """Lower the body's ``max_tokens`` to the rollout's cap (or set it, where the client set none)."""
    if cap is not None:
        asked = body.get("max_tokens")
        body["max_tokens"] = cap if asked is None else min(asked, cap)


def client_wants(req: dict, *, chat: bool) -> tuple[bool, bool]:
    """Whether the client asked for token ids, and for logprobs (a bool in chat, an int in text completions)."""
    logprobs = req.get("logprobs")
    wants_logprobs = (logprobs is True) if chat else (logprobs is not None and logprobs is not False)
    return bool(req.get("return_token_ids")), wants_logprobs


def take_chat_tokens(resp: dict, *, keep_ids: bool, keep_logprobs: bool) -> tuple[list[int], list[ChoiceTokens]]:
    """Pull prompt and response ids out of a chat answer, stripping what the client did not ask for."""
    prompt = resp.get("prompt_token_ids")
    if prompt is None:
        raise no_ids_error("prompt_token_ids")
    choices = resp.get("choices") or []
    tokens = [_take_choice(c, i, chat_logprobs, keep_ids, keep_logprobs) for i, c in enumerate(choices)]
    if not keep_ids:
        _drop_id_extras(resp)
    return prompt, tokens


def take_completion_tokens(resp: dict, *, keep_ids: bool, keep_logprobs: bool) -> tuple[list[int], list[ChoiceTokens]]:
    """Pull prompt and response ids out of a text completion answer (the prompt's may be on each choice)."""
    prompt = resp.get("prompt_token_ids")
    tokens = []
    for i, choice in enumerate(resp.get("choices") or []):
        prompt = choice.get("prompt_token_ids") or prompt
        tokens.append(_take_choice(choice, i, completion_logprobs, keep_ids, keep_logprobs))
        if not keep_ids:
            choice.pop("prompt_token_ids", None)
    if prompt is None:
        raise no_ids_error("prompt_token_ids")
    if not keep_ids:
        _drop_id_extras(resp)
    return prompt, tokens


def _take_choice(
    choice: dict, position: int, logprobs_of: Callable[[dict], Any], keep_ids: bool, keep_logprobs: bool
) -> ChoiceTokens:
    """One choice's ids and logprobs; its ids and logprobs are then stripped unless kept."""
    ids = choice.get("token_ids")
    if ids is None:
        raise no_ids_error("choices[].token_ids")
    taken = ChoiceTokens(choice.get("index", position), ids, logprobs_of(choice), choice.get("behaviour_logprobs"))
    if not keep_ids:
        choice.pop("token_ids", None)
        choice.pop("behaviour_logprobs", None)
    if not keep_logprobs:
        choice["logprobs"] = None
    return taken


def _drop_id_extras(resp: dict) -> None:
    for key in TOKEN_ID_EXTRAS:
        resp.pop(key, None)


class StreamAccumulator:
    """Collects a streamed chat or text completion into the answer it adds up to, with its ids."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.prompt_ids: list[int] | None = None
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict | None = None
        self.first: dict | None = None

    def _choice(self, index: int) -> dict[str, Any]:
        c = self.choices.get(index)
        if c is None:
            c = self.choices[index] = {
                "ids": [],
                "logprobs": [],
                "has_logprobs": False,
                "behaviour": [],
                "has_behaviour": False,
                "text": [],
                "tool_calls": {},
                "finish_reason": None,
                "role": "assistant",
            }
        return c

    def feed(self, chunk: dict) -> None:
        """Take one chunk (before it is stripped for the client)."""
        if self.first is None:
            self.first = chunk
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            c = self._choice(choice.get("index", 0))
            if not self.chat and choice.get("prompt_token_ids") is not None:
                self.prompt_ids = choice["prompt_token_ids"]
            if choice.get("token_ids"):
                c["ids"].extend(choice["token_ids"])
            if choice.get("behaviour_logprobs") is not None:
                c["has_behaviour"] = True
                c["behaviour"].extend(choice["behaviour_logprobs"])
            values = chat_logprobs(choice) if self.chat else completion_logprobs(choice)
            if values is not None:
                c["has_logprobs"] = True
                c["logprobs"].extend(values)
            if choice.get("finish_reason") is not None:
                c["finish_reason"] = choice["finish_reason"]
            if self.chat:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    c["text"].append(delta["content"])
                for tc in delta.get("tool_calls") or []:
                    slot = c["tool_calls"].setdefault(
                        tc.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    if tc.get("id"):
                        slot["id"] = tc["id"]
                    fn = tc.get("function") or {}
                    if fn.get("name"):
                        slot["function"]["name"] += fn["name"]
                    if fn.get("arguments"):
                        slot["function"]["arguments"] += fn["arguments"]
            elif choice.get("text"):
                c["text"].append(choice["text"])

    def tokens(self) -> tuple[list[int], list[ChoiceTokens]]:
        if self.prompt_ids is None:
            raise no_ids_error("prompt_token_ids in the stream")
        out = []
        for index in sorted(self.choices):
            c = self.choices[index]
            out.append(
                ChoiceTokens(
                    index,
                    c["ids"],
                    c["logprobs"] if c["has_logprobs"] else None,
                    c["behaviour"] if c["has_behaviour"] else None,
                )
            )
        return self.prompt_ids, out

    def response(self, call_id: str, model: str | None) -> dict:
        """The non-streamed answer this stream adds up to (what gets recorded)."""
        first = self.first or {}
        choices = []
        for index in sorted(self.choices):
            c = self.choices[index]
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": "".join(c["text"]) or None}
                if c["tool_calls"]:
                    message["tool_calls"] = [c["tool_calls"][k] for k in sorted(c["tool_calls"])]
                choices.append({"index": index, "message": message, "finish_reason": c["finish_reason"]})
            else:
                choices.append({"index": index, "text": "".join(c["text"]), "finish_reason": c["finish_reason"]})
        return {
            "id": call_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": first.get("created"),
            "model": model or first.get("model"),
            "choices": choices,
            "usage": self.usage,
        } | ({"model_version": first["model_version"]} if "model_version" in first else {})


def strip_chunk(chunk: dict, *, keep_ids: bool, keep_logprobs: bool) -> None:
    """Remove the token-id extras from a stream chunk, in place, unless the client asked for them."""
    if not keep_ids:
        for key in TOKEN_ID_EXTRAS:
            chunk.pop(key, None)
    for choice in chunk.get("choices") or []:
        if not keep_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
            choice.pop("behaviour_logprobs", None)
        if not keep_logprobs and "logprobs" in choice:
            choice["logprobs"] = None
