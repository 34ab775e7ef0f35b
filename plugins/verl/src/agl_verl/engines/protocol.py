"""Validation of OpenAI-style request bodies for the transformers engine.

Every problem raises :class:`RequestError` naming the offending field (``param``), which
the server turns into a 400 with an OpenAI-style error body. Fields the engine does not
use (``user``, ``metadata``, ``store``, ...) are ignored; fields it cannot honour with a
non-default value (``frequency_penalty``, ``response_format`` other than text, ``echo``)
are refused rather than silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agl_verl.engines.tools import ToolChoice

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 64
MAX_TOP_LOGPROBS = 20


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


@dataclass
class Sampling:
    """Sampling fields shared by chat and completion requests (max_tokens None: fill the context)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
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


def _get(body: dict, name: str, kinds: tuple, default: Any = None, *, nullable: bool = True) -> Any:
    value = body.get(name, default)
    if value is None:
        if not nullable and name in body:
            raise RequestError(name, f"{name} must not be null")
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise RequestError(name, f"{name} must be {_names(kinds)}, not a boolean")
    if not isinstance(value, kinds):
        raise RequestError(name, f"{name} must be {_names(kinds)}, not {type(value).__name__}")
    return value


def _names(kinds: tuple) -> str:
    words = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(words.get(k, k.__name__) for k in kinds)


def parse_sampling(body: dict, *, default_max_tokens: int | None) -> Sampling:
    s = Sampling()
    s.n = _get(body, "n", (int,), 1)
    if not 1 <= s.n <= MAX_N:
        raise RequestError("n", f"n must be between 1 and {MAX_N}, got {s.n}")
    s.temperature = float(_get(body, "temperature", (int, float), 1.0))
    if not 0.0 <= s.temperature <= 2.0:
        raise RequestError("temperature", f"temperature must be between 0 and 2, got {s.temperature}")
    s.top_p = float(_get(body, "top_p", (int, float), 1.0))
    if not 0.0 < s.top_p <= 1.0:
        raise RequestError("top_p", f"top_p must be in (0, 1], got {s.top_p}")
    for name in ("max_completion_tokens", "max_tokens"):
        value = _get(body, name, (int,))
        if value is not None:
            if value < 1:
                raise RequestError(name, f"{name} must be at least 1, got {value}")
            s.max_tokens = value
            break
    else:
        s.max_tokens = default_max_tokens
    stop = body.get("stop")
    if isinstance(stop, str):
        s.stop = [stop]
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        s.stop = [x for x in stop if x]
    elif stop is not None:
        raise RequestError("stop", "stop must be a string or a list of strings")
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise RequestError("stop_token_ids", "stop_token_ids must be a list of integers")
        s.stop_token_ids = ids
    s.seed = _get(body, "seed", (int,))
    s.ignore_eos = bool(_get(body, "ignore_eos", (bool,), False))
    s.stream = bool(_get(body, "stream", (bool,), False))
    options = _get(body, "stream_options", (dict,), {})
    s.include_usage = bool(options.get("include_usage", False))
    s.return_token_ids = bool(_get(body, "return_token_ids", (bool,), False))
    for name in ("frequency_penalty", "presence_penalty"):
        value = _get(body, name, (int, float), 0)
        if value != 0:
            raise RequestError(name, f"{name} is not supported by this engine (only 0)")
    return s


def _text_content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise RequestError(f"{where}[{j}].text", "a text part needs a string 'text'")
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}[{j}].type", f"content part type {kind!r} is not supported (text only)")
        return "".join(parts)
    raise RequestError(where, "content must be a string, null or a list of text parts")


def parse_messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages", "messages must be a non-empty list")
    messages = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(where, "each message must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role", f"role must be one of {', '.join(ROLES)}, got {role!r}")
        out: dict[str, Any] = {"role": "system" if role == "developer" else role}
        out["content"] = _text_content(message.get("content"), f"{where}.content")
        calls = message.get("tool_calls")
        if calls:
            if role != "assistant":
                raise RequestError(f"{where}.tool_calls", "only assistant messages carry tool_calls")
            if not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls", "tool_calls must be a list")
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RequestError(f"{where}.tool_calls[{j}].function.name", "a tool call needs a function name")
            out["tool_calls"] = calls
        elif out["content"] is None and role != "assistant":
            raise RequestError(f"{where}.content", f"a {role} message needs content")
        if role == "tool":
            out["tool_call_id"] = message.get("tool_call_id")
            if message.get("name"):
                out["name"] = message["name"]
        messages.append(out)
    return messages


def parse_tools(body: dict) -> tuple[list[dict] | None, ToolChoice]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise RequestError("tools", "tools must be a list")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type", "function") != "function":
                raise RequestError(f"tools[{i}].type", "only function tools are supported")
            fn = tool.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise RequestError(f"tools[{i}].function.name", "a tool needs a function name")
        tools = tools or None
    raw = body.get("tool_choice")
    if raw is None:
        choice = ToolChoice("auto" if tools else "none")
    elif raw in ("none", "auto", "required"):
        choice = ToolChoice(raw)
    elif (
        isinstance(raw, dict) and isinstance(raw.get("function"), dict) and isinstance(raw["function"].get("name"), str)
    ):
        choice = ToolChoice("function", raw["function"]["name"])
    else:
        raise RequestError(
            "tool_choice", "tool_choice must be none, auto, required or {type: function, function: {name}}"
        )
    if choice.mode in ("required", "function") and not tools:
        raise RequestError("tool_choice", f"tool_choice {choice.mode!r} needs tools")
    if choice.mode == "function" and choice.name not in {t["function"]["name"] for t in tools or []}:
        raise RequestError("tool_choice", f"tool_choice names {choice.name!r}, which is not among the tools")
    return tools, choice


def parse_chat(body: Any) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body."""
    if not isinstance(body, dict):
        raise RequestError(None, "the request body must be a JSON object")
    fmt = _get(body, "response_format", (dict,))
    if fmt is not None and fmt.get("type", "text") != "text":
        raise RequestError("response_format", f"response_format {fmt.get('type')!r} is not supported by this engine")
    logprobs = bool(_get(body, "logprobs", (bool,), False))
    top = _get(body, "top_logprobs", (int,), 0)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise RequestError("top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    tools, choice = parse_tools(body)
    return ChatRequest(
        model=_get(body, "model", (str,), ""),
        messages=parse_messages(body.get("messages")),
        sampling=parse_sampling(body, default_max_tokens=None),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=bool(_get(body, "parallel_tool_calls", (bool,), True)),
        logprobs=logprobs or top > 0,
        top_logprobs=top,
        add_generation_prompt=bool(_get(body, "add_generation_prompt", (bool,), True)),
        continue_final_message=bool(_get(body, "continue_final_message", (bool,), False)),
    )


def parse_completion(body: Any, vocab_size: int) -> CompletionRequest:
    """Validate a ``/v1/completions`` body (prompt: text, token ids, or a list of either)."""
    if not isinstance(body, dict):
        raise RequestError(None, "the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_id(x) for x in prompt)):
        prompts = [prompt]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, str) or (isinstance(p, list) and p and all(_is_id(x) for x in p)) for p in prompt)
    ):
        prompts = list(prompt)
    else:
        raise RequestError("prompt", "prompt must be a string, a non-empty list of token ids, or a list of those")
    for i, p in enumerate(prompts):
        if isinstance(p, list):
            bad = [x for x in p if not 0 <= x < vocab_size]
            if bad:
                raise RequestError("prompt", f"prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
    if body.get("echo"):
        raise RequestError("echo", "echo is not supported by this engine")
    if body.get("suffix"):
        raise RequestError("suffix", "suffix is not supported by this engine")
    logprobs = _get(body, "logprobs", (int,))
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError("logprobs", f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    return CompletionRequest(
        model=_get(body, "model", (str,), ""),
        prompts=prompts,
        sampling=parse_sampling(body, default_max_tokens=16),
        logprobs=logprobs,
    )


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
