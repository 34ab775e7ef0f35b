"""Plain chat requests, told without building the request model.

Most chat requests an agent sends are plain: text messages of the system, developer, user
and assistant roles, and a few sampling settings of the right types within their bounds.
:func:`is_plain_chat` says so of a body in a few microseconds, where building
:class:`~agl_trainer.openai_requests.ChatCompletionRequest` costs several times that in a
serving process. It only ever answers True for a body the model accepts (every field it looks
at is checked as the model checks it, and any field of the model it does not know makes it
answer False); a body it answers False for is checked by the model, which accepts or refuses
it and names the field. So the model stays the one definition of a valid request, and this is
a shortcut past it for the bodies that plainly pass. Fields the model does not name are kept
as the model keeps them (``extra="allow"``): they are passed on to the engine untouched.

Why (issue 46): in the gateway's own process, with the call's other work around it, building
the model for the benchmark's request took about 20 us of CPU a call (5.3 us timed alone), against
about 7 us for the hand-written checks the gateway had at 28dbf9d: most of what the gateway's app
spent a call above that commit's (the figures are in :mod:`agl_trainer.gateway.app`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agl.schema import INT64_MAX, INT64_MIN
from agl_trainer.openai_requests import MAX_N, ChatCompletionRequest

_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})
"""Roles whose text messages need nothing of the model's links between messages (tool calls)."""
_MESSAGE_FIELDS_CHECKED_HERE = frozenset({"role", "content"})
_MESSAGE_FIELDS = frozenset({"role", "content", "tool_calls", "tool_call_id"})
""":class:`~agl_trainer.openai_requests.Message`'s fields (a test checks this against the model)."""


def _is_bool(value: Any) -> bool:
    return value.__class__ is bool


def _int_within(lo: int, hi: int) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return value.__class__ is int and lo <= value <= hi

    return check


def _is_positive_int(value: Any) -> bool:
    return value.__class__ is int and value >= 1


def _number_within(lo: float, hi: float) -> Callable[[Any], bool]:
    # the model's floats are strict: a float or an int (never a bool), NaN refused by the comparison
    def check(value: Any) -> bool:
        return (value.__class__ is float or value.__class__ is int) and lo <= value <= hi

    return check


def _is_str(value: Any) -> bool:
    return value.__class__ is str


def _is_stop(value: Any) -> bool:
    return value.__class__ is str or (value.__class__ is list and all(s.__class__ is str for s in value))


def _are_plain_messages(messages: Any) -> bool:
    if messages.__class__ is not list or not messages:
        return False
    for message in messages:
        if message.__class__ is not dict:
            return False
        role = message.get("role")
        if role.__class__ is not str or role not in _PLAIN_ROLES or message.get("content").__class__ is not str:
            return False
        if len(message) > 2 and not _MESSAGE_FIELDS.isdisjoint(message.keys() - _MESSAGE_FIELDS_CHECKED_HERE):
            return False  # tool calls or a tool call id: the model checks them
    return True


PLAIN_FIELDS: dict[str, Callable[[Any], bool]] = {
    "model": _is_str,
    "messages": _are_plain_messages,
    "temperature": _number_within(0, 2),
    "top_p": _number_within(0, 1),
    "seed": _int_within(INT64_MIN, INT64_MAX),
    "stop": _is_stop,
    "stream": _is_bool,
    "n": _int_within(1, MAX_N),
    "max_tokens": _is_positive_int,
    "max_completion_tokens": _is_positive_int,
    "frequency_penalty": _number_within(-2, 2),
    "presence_penalty": _number_within(-2, 2),
    "ignore_eos": _is_bool,
    "return_token_ids": _is_bool,
    "logprobs": _is_bool,
    "parallel_tool_calls": _is_bool,
    "add_generation_prompt": _is_bool,
    "continue_final_message": _is_bool,
}
"""The request fields told here, each with what it must be; None is what the model takes for
any of them but ``messages`` (which is required)."""
_MODEL_FIELDS = frozenset(ChatCompletionRequest.model_fields)


def is_plain_chat(req: dict) -> bool:
    """Whether ``req`` (a JSON object) is a chat request the model accepts as it is, told without
    the model: True only for one it accepts; False says nothing (the model is to be asked)."""
    if "messages" not in req:
        return False
    for name, value in req.items():
        check = PLAIN_FIELDS.get(name)
        if check is None:
            if name in _MODEL_FIELDS:
                return False  # a field of the model told only by the model (tools, response_format, ...)
            continue  # not the model's: kept as it is
        if value is None:
            if name == "messages":
                return False
            continue
        if not check(value):
            return False
    return True
