"""Checks on client requests, before anything is sent to an engine.

Each check raises a 400 naming the field and the reason. Only what the gateway
relies on, or what would otherwise fail obscurely deep in an engine, is checked;
unknown fields are passed through to the engine untouched.
"""

from __future__ import annotations

from typing import Any

from agl.schema import INT64_MAX, INT64_MIN, json_problem
from agl_trainer.gateway.errors import invalid

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_N = 128
TOKEN_ID_MAX = 2**31 - 1
"""The largest token id the store keeps (ids are packed as int32)."""


def _int(req: dict, name: str, *, lo: int, hi: int | None = None, param: str | None = None) -> None:
    value = req.get(name)
    if value is None:
        return
    param = param or name
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(param, f"must be an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        raise invalid(param, f"must be between {lo} and {hi}, got {value}" if hi else f"must be >= {lo}, got {value}")


def check_body(req: Any) -> None:
    """What every request body must be: a JSON object of finite numbers and 64-bit integers,
    nested no deeper than the store keeps (:data:`agl.schema.MAX_JSON_DEPTH`)."""
    if not isinstance(req, dict):
        raise invalid("body", "must be a JSON object", code="invalid_json")
    problem = json_problem(req)
    if problem is not None:
        path, reason = problem
        raise invalid(path or "body", reason)
    parts = _lone_surrogate(req)
    if parts is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in reversed(parts)).lstrip(".")
        raise invalid(where or "body", "holds a lone surrogate (\\ud800-\\udfff not in a pair), not valid Unicode")


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


def check_int(req: dict, name: str, *, lo: int, hi: int | None = None, param: str | None = None) -> None:
    """``req[name]``, if given, is an integer within ``lo`` and ``hi``; the 400 names ``param`` (``name``)."""
    _int(req, name, lo=lo, hi=hi, param=param)


def _number(req: dict, name: str, *, lo: float, hi: float) -> None:
    value = req.get(name)
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise invalid(name, f"must be a number, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise invalid(name, f"must be between {lo} and {hi}, got {value}")


def _bool(req: dict, name: str) -> None:
    value = req.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid(name, f"must be true or false, got {value!r}")


def check_sampling(req: dict) -> None:
    """Fields common to chat and text completions."""
    _int(req, "n", lo=1, hi=MAX_N)
    _number(req, "temperature", lo=0, hi=2)
    _number(req, "top_p", lo=0, hi=1)
    _int(req, "max_tokens", lo=1)
    _int(req, "max_completion_tokens", lo=1)
    _int(req, "seed", lo=INT64_MIN, hi=INT64_MAX)
    _bool(req, "stream")
    stop = req.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop))
    ):
        raise invalid("stop", "must be a string or a list of strings")
    opts = req.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise invalid("stream_options", "must be an object")
        _bool(opts, "include_usage")


def _check_content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid(f"{where}.content", "must be a string, a list of content parts or null")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise invalid(f"{where}.content[{j}]", "must be an object with a 'type'")


def check_tools(tools: Any, param: str = "tools") -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise invalid(param, "must be a list of tool definitions")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"{param}[{i}]", "must be an object")
        if tool.get("type", "function") != "function":
            raise invalid(f"{param}[{i}].type", f"only 'function' tools are supported, got {tool.get('type')!r}")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"{param}[{i}].function.name", "is required (a non-empty string)")


def check_tool_choice(choice: Any, tools: list | None) -> None:
    if choice is None or choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise invalid("tool_choice", "'required' needs at least one tool in 'tools'")
        return
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        names = {(t.get("function") or {}).get("name") for t in tools or []}
        if name not in names:
            raise invalid("tool_choice", f"names function {name!r}, which is not in 'tools'")
        return
    raise invalid(
        "tool_choice", "must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}"
    )


def check_response_format(fmt: Any) -> None:
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid("response_format", "must be {'type': 'text' | 'json_object' | 'json_schema', ...}")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("json_schema"), dict):
        raise invalid("response_format.json_schema", "is required for type 'json_schema' (an object with a schema)")


def check_chat(req: dict) -> None:
    """A ``/v1/chat/completions`` request body."""
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid(
            "messages",
            "is required: a non-empty list of messages",
            code="missing_required_parameter" if messages is None else "invalid_value",
        )
    call_ids: set[str] = set()  # ids of the tool calls made so far
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(where, "must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{where}.role", f"must be one of {sorted(ROLES)}, got {role!r}")
        _check_content(msg.get("content"), where)
        calls = msg.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise invalid(f"{where}.tool_calls", "must be a list, on an assistant message")
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise invalid(f"{where}.tool_calls[{j}].function.name", "is required")
                if fn.get("arguments") is None:  # required by OpenAI and by the engine's chat template
                    raise invalid(
                        f"{where}.tool_calls[{j}].function.arguments",
                        "is required (the arguments as JSON text)",
                        code="missing_required_parameter",
                    )
                check_arguments(fn.get("arguments"), f"{where}.tool_calls[{j}].function.arguments")
                if not isinstance(call.get("id"), str) or not call["id"]:
                    raise invalid(f"{where}.tool_calls[{j}].id", "is required (a non-empty string)")
                call_ids.add(call["id"])
        if role == "tool":
            answered = msg.get("tool_call_id")
            if not isinstance(answered, str):
                raise invalid(f"{where}.tool_call_id", "is required on a tool message")
            if answered not in call_ids:
                raise invalid(
                    f"{where}.tool_call_id",
                    f"{answered!r} answers no tool call: a tool message must follow an assistant message "
                    "whose tool_calls has that id",
                )
    check_sampling(req)
    check_tools(req.get("tools"))
    check_tool_choice(req.get("tool_choice"), req.get("tools"))
    _bool(req, "parallel_tool_calls")
    _bool(req, "logprobs")
    _int(req, "top_logprobs", lo=0, hi=20)
    check_response_format(req.get("response_format"))


def check_arguments(arguments: Any, param: str) -> None:
    """Tool-call arguments, where given, are JSON text (a string), as OpenAI requires."""
    if arguments is not None and not isinstance(arguments, str):
        raise invalid(param, f"must be a string (the arguments as JSON text), got {type(arguments).__name__}")


def check_completion(req: dict) -> None:
    """A ``/v1/completions`` request body: one prompt, as text or token ids."""
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = req["prompt"] = prompt[0]
    if isinstance(prompt, str):
        if not prompt:  # no prompt ids to record (vLLM refuses it too)
            raise invalid("prompt", "must not be empty")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 for t in prompt):
            raise invalid("prompt", "token ids must be non-negative")
        # The engine refuses ids past its vocabulary (400, passed on); ids past int32 could not
        # even be recorded, so they are refused here whatever the engine would say.
        if any(t > TOKEN_ID_MAX for t in prompt):
            raise invalid("prompt", f"token ids must be at most {TOKEN_ID_MAX}, got {max(prompt)}")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid("prompt", "batched prompts are not supported: send one request per prompt")
    else:
        raise invalid(
            "prompt",
            "is required: a string or a non-empty list of token ids",
            code="missing_required_parameter" if prompt is None else "invalid_value",
        )
    check_sampling(req)
    logprobs = req.get("logprobs")
    if logprobs is not None and (
        not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 20
    ):
        raise invalid("logprobs", f"must be an integer between 0 and 20, got {logprobs!r}")
    _bool(req, "echo")
    if req.get("echo"):
        raise invalid("echo", "is not supported by the gateway (it records prompt ids separately)")
