"""OpenAI-style request bodies for the transformers engine, as the engine runs them.

Bodies are checked by the models of :mod:`agl_trainer.openai_requests`, the same the
gateway checks with (one set of limits). Every problem raises :class:`RequestError` naming
the offending field (``param``), which the server turns into a 400 with an OpenAI-style
error body. Fields the engine does not use (``user``, ``metadata``, ``store``, ...) are
ignored; fields it cannot honour with a non-default value (``frequency_penalty``,
``response_format`` other than text, content parts other than text, the deprecated
``function`` role) are refused rather than silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from agl_trainer import openai_requests as oai
from agl_verl.engines.tools import ToolChoice


class RequestError(Exception):
    """A bad request: ``param`` names the field, ``status`` is the HTTP status."""

    def __init__(self, param: str | None, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.status = status

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


@dataclass(kw_only=True)
class Decoding:
    """How a request's rows are decoded: what a request asks for and each of its rows
    (:class:`agl_verl.engines.batching.SamplingParams`) keeps. ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def decoding(self) -> dict[str, Any]:
        """These settings alone, as keyword arguments (of a row's ``SamplingParams``)."""
        return {f.name: getattr(self, f.name) for f in fields(Decoding)}


@dataclass(kw_only=True)
class Sampling(Decoding):
    """Sampling fields shared by chat and completion requests (max_tokens None: fill the context)."""

    n: int = 1
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]
    sampling: Sampling
    tools: list[dict] | None
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    logprobs: bool
    top_logprobs: int
    add_generation_prompt: bool
    continue_final_message: bool


@dataclass
class CompletionRequest:
    model: str
    prompts: list[str | list[int]]
    sampling: Sampling
    logprobs: int | None


def _checked(model: type, body: Any) -> Any:
    try:
        return oai.validate(model, body)
    except oai.InvalidRequest as exc:
        raise RequestError(exc.param, str(exc)) from None


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def parse_sampling(body: oai.Sampling, *, default_max_tokens: int | None) -> Sampling:
    """The sampling settings of a checked request (``max_completion_tokens`` before ``max_tokens``)."""
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name):
            raise RequestError(name, f"{name}: is not supported by this engine (only 0)")
    options = body.stream_options
    return Sampling(
        n=_or(body.n, 1),
        temperature=_or(body.temperature, 1.0),
        top_p=_or(body.top_p, 1.0),
        max_tokens=_or(body.max_completion_tokens, _or(body.max_tokens, default_max_tokens)),
        stop=body.stops(),
        stop_token_ids=body.stop_token_ids or [],
        seed=body.seed,
        ignore_eos=bool(body.ignore_eos),
        stream=bool(body.stream),
        include_usage=bool(options and options.include_usage),
        return_token_ids=bool(body.return_token_ids),
    )


def parse_messages(messages: list[oai.Message], raw: list[dict]) -> list[dict]:
    """The messages for the chat template: text content only, ``developer`` as ``system``."""
    out = []
    for i, (message, given) in enumerate(zip(messages, raw, strict=True)):
        if message.role == "function":
            raise RequestError(f"messages[{i}].role", "the deprecated 'function' role is not supported: use 'tool'")
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            if part["type"] not in oai.TEXT_PARTS:
                where = f"messages[{i}].content[{j}].type"
                raise RequestError(where, f"{where}: content part type {part['type']!r} is not supported (text only)")
        item: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
        item["content"] = message.text()
        if message.tool_calls:
            item["tool_calls"] = given["tool_calls"]
        if message.role == "tool":
            item["tool_call_id"] = message.tool_call_id
            if given.get("name"):
                item["name"] = given["name"]
        out.append(item)
    return out


def parse_tool_choice(body: oai.ChatCompletionRequest) -> ToolChoice:
    """The checked request's ``tool_choice`` (default: auto with tools, none without)."""
    choice = body.tool_choice
    if choice is None:
        return ToolChoice("auto" if body.tools else "none")
    if isinstance(choice, dict):
        return ToolChoice("function", choice["function"]["name"])
    return ToolChoice(choice)


def parse_chat(body: Any) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body (:class:`agl_trainer.openai_requests.ChatCompletionRequest`)."""
    checked = _checked(oai.ChatCompletionRequest, body)
    fmt = checked.response_format
    if fmt is not None and fmt["type"] != "text":
        raise RequestError("response_format", f"response_format: {fmt['type']!r} is not supported by this engine")
    top = _or(checked.top_logprobs, 0)
    return ChatRequest(
        model=_or(checked.model, ""),
        messages=parse_messages(checked.messages, body["messages"]),
        sampling=parse_sampling(checked, default_max_tokens=None),
        tools=body.get("tools") or None,
        tool_choice=parse_tool_choice(checked),
        parallel_tool_calls=_or(checked.parallel_tool_calls, True),
        logprobs=bool(checked.logprobs) or top > 0,
        top_logprobs=top,
        add_generation_prompt=_or(checked.add_generation_prompt, True),
        continue_final_message=bool(checked.continue_final_message),
    )


def parse_completion(body: Any, vocab_size: int) -> CompletionRequest:
    """Validate a ``/v1/completions`` body (prompt: text, token ids, or a list of either)."""
    checked = _checked(oai.CompletionRequest, body)
    prompts = checked.prompts()
    for i, p in enumerate(prompts):
        if isinstance(p, list):
            bad = [x for x in p if not x < vocab_size]
            if bad:
                raise RequestError("prompt", f"prompt: prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
    return CompletionRequest(
        model=_or(checked.model, ""),
        prompts=prompts,
        sampling=parse_sampling(checked, default_max_tokens=16),
        logprobs=checked.logprobs,
    )
