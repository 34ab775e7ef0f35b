"""Checks on client requests, before anything is sent to an engine.

Each check raises a 400 naming the field and the reason. The request's fields are
checked by the models in :mod:`agl_trainer.openai_requests`, which the engine uses too;
unknown fields of chat and completion requests are passed through to the engine untouched.
Anthropic Messages bodies are checked by :mod:`agl_trainer.anthropic_requests`.
"""

from __future__ import annotations

from typing import Any

from agl.schema import json_problem
from agl_trainer import anthropic_requests, openai_requests
from agl_trainer.gateway.errors import invalid
from agl_trainer.gateway.plain_chat import is_plain_chat


def check_body(req: Any, text: bytes | None = None) -> None:
    """What every request body must be: a JSON object of finite numbers and 64-bit integers,
    nested no deeper than the store keeps (:data:`agl.schema.MAX_JSON_DEPTH`).

    ``text``, the JSON text ``req`` was parsed from, spares the walk for lone surrogates when it
    cannot hold one (:func:`_may_hold_surrogate`)."""
    if not isinstance(req, dict):
        raise invalid("body", "must be a JSON object", code="invalid_json")
    problem = json_problem(req)
    if problem is not None:
        path, reason = problem
        raise invalid(path or "body", reason)
    if text is not None and not _may_hold_surrogate(text):
        return
    parts = _lone_surrogate(req)
    if parts is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in reversed(parts)).lstrip(".")
        raise invalid(where or "body", "holds a lone surrogate (\\ud800-\\udfff not in a pair), not valid Unicode")


def _may_hold_surrogate(text: bytes) -> bool:
    """Whether JSON text may decode to a string holding a surrogate. In UTF-8 text (no NUL byte,
    which UTF-16 and UTF-32 JSON always hold) one comes of a ``\\uD800``-``\\uDFFF`` escape or of
    the bytes ``ED A0``-``ED BF`` (``json.loads`` decodes bytes with ``surrogatepass``); text
    holding none of ``\\ud``, ``\\uD``, the byte ``ED`` and NUL cannot."""
    return b"\\ud" in text or b"\\uD" in text or b"\xed" in text or b"\x00" in text


def _lone_surrogate(value: Any) -> list[Any] | None:
    """The path, innermost first, to the first string in ``value`` that cannot be encoded as UTF-8, or None.

    ``json.loads`` accepts ``"\\ud800"`` alone; the engine's tokenizer and the store cannot take it.
    A key that cannot be encoded is named by the object holding it.
    """
    kind = type(value)
    if kind is str:
        if value.isascii():
            return None
        try:
            value.encode()
        except UnicodeEncodeError:
            return []
        return None
    if kind is dict:
        for key, item in value.items():
            if _lone_surrogate(key) is not None:
                return []
            found = _lone_surrogate(item)
            if found is not None:
                found.append(key)
                return found
    elif kind is list:
        for i, item in enumerate(value):
            found = _lone_surrogate(item)
            if found is not None:
                found.append(i)
                return found
    return None


def _checked(model: type, req: dict):
    try:
        return openai_requests.validate(model, req)
    except openai_requests.InvalidRequest as exc:
        raise invalid(exc.param, exc.reason, code=exc.code) from None


def check_chat(req: dict) -> None:
    """A ``/v1/chat/completions`` request body (:class:`agl_trainer.openai_requests.ChatCompletionRequest`);
    a plain one (:func:`~agl_trainer.gateway.plain_chat.is_plain_chat`) passes without building the model."""
    if not is_plain_chat(req):
        _checked(openai_requests.ChatCompletionRequest, req)


def check_completion(req: dict) -> openai_requests.CompletionRequest:
    """A ``/v1/completions`` request body: one prompt, as text or token ids (a list of one is unwrapped in ``req``)."""
    parsed = _checked(openai_requests.CompletionRequest, req)
    prompts = parsed.prompts()
    if len(prompts) > 1:  # the gateway records one prompt's ids per call
        raise invalid("prompt", "batched prompts are not supported: send one request per prompt")
    req["prompt"] = prompts[0]
    return parsed


def check_responses(req: dict) -> openai_requests.ResponsesRequest:
    """A ``/v1/responses`` request body (:class:`agl_trainer.openai_requests.ResponsesRequest`)."""
    return _checked(openai_requests.ResponsesRequest, req)


def check_messages(req: dict) -> anthropic_requests.MessagesRequest:
    """A ``/v1/messages`` request body (:class:`agl_trainer.anthropic_requests.MessagesRequest`)."""
    return _checked(anthropic_requests.MessagesRequest, req)


def check_count_tokens(req: dict) -> anthropic_requests.CountTokensRequest:
    """A ``/v1/messages/count_tokens`` body (:class:`agl_trainer.anthropic_requests.CountTokensRequest`)."""
    return _checked(anthropic_requests.CountTokensRequest, req)
