"""One model of the OpenAI request bodies agl serves, with one set of limits.

The gateway (:mod:`agl_trainer.gateway`) and the transformers engine
(:mod:`agl_verl.engines.protocol`) both check requests with these pydantic models:
:class:`ChatCompletionRequest` (``/v1/chat/completions``), :class:`CompletionRequest`
(``/v1/completions``) and :class:`ResponsesRequest` (``/v1/responses``, which the gateway
turns into a chat request). A bad body raises :class:`InvalidRequest` naming the field
(``messages[1].tool_calls[0].id``) and the reason; each server answers it in OpenAI's
error shape. What a server cannot do with a well-formed request (the engine's
``frequency_penalty``, the gateway's batched prompts) each server refuses itself.

Chat and completion bodies keep unknown fields (SDKs send many: ``user``, ``metadata``,
vLLM's extras): the gateway passes them on untouched. A Responses body with an unknown
field is refused with code ``unknown_parameter``, as OpenAI does.

Limits, decided against OpenAI's own OpenAPI description of the API (``openapi.yaml`` in
github.com/openai/openai-openapi: ``CreateChatCompletionRequest``, ``CreateCompletionRequest``,
``CreateResponse``) where the gateway and the engine differed:

- ``n``: 1 to 128 (:data:`MAX_N`), OpenAI's ``minimum: 1, maximum: 128``. The engine's 64
  had no reason of its own (its continuous batcher queues rows past ``max_batch_size``).
- ``top_p``: 0 to 1, 0 included, OpenAI's ``minimum: 0, maximum: 1`` (vLLM refuses 0, so
  a gateway in front of vLLM passes vLLM's 400 on). The engine's nucleus filter always
  keeps the most likely token, so ``top_p=0`` samples that token.
- ``seed``: a 64-bit integer, OpenAI's range (the engine took any integer; the store
  keeps 64 bits).
- Where OpenAI is stricter, the servers' common practice stays: a completion's
  ``logprobs`` up to 20 (OpenAI: 5; vLLM: 20), ``max_output_tokens`` from 1 (OpenAI: 16),
  any number of stop strings (OpenAI: 4).
- ``temperature`` 0 to 2, ``frequency_penalty`` and ``presence_penalty`` -2 to 2,
  ``top_logprobs`` 0 to 20, ``max_tokens`` at least 1, as OpenAI says.
- Messages: the roles OpenAI knows (``function`` included, deprecated); content is
  required except on an assistant message; an assistant's tool calls need an ``id`` and
  ``function.arguments`` as JSON text, and a tool message must answer an earlier call's
  id (OpenAI refuses both; the engine used to let them through).
- A completion's prompt is a non-empty string, a non-empty list of token ids (0 to
  2**31 - 1, what the store keeps) or a list of those; ``echo`` and ``suffix`` are refused
  (neither server nor vLLM can honour them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from agl.schema import INT64_MAX, INT64_MIN

MAX_N = 128
"""The most choices one request may ask for (OpenAI's limit)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token ``top_logprobs`` (chat) or ``logprobs`` (completions) may ask for."""
TOKEN_ID_MAX = 2**31 - 1
"""The largest token id the store keeps (ids are packed as int32)."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
TEXT_PARTS = ("text", "input_text", "output_text")
"""Content part types that carry their text in ``text``."""


class InvalidRequest(Exception):
    """A request body that breaks the model: ``param`` names the field, ``reason`` says why.

    ``code`` is OpenAI's: ``invalid_value``, ``missing_required_parameter`` or ``unknown_parameter``.
    """

    def __init__(self, param: str, reason: str, code: str = "invalid_value") -> None:
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason
        self.code = code


class Problem(ValueError):
    """Raised inside a validator: ``reason``, at ``at`` below the field validated (a path of keys and indices)."""

    def __init__(self, reason: str, *at: str | int, code: str = "invalid_value") -> None:
        super().__init__(reason)
        self.reason = reason
        self.at = at
        self.code = code


def _between(lo: float, hi: float | None = None) -> AfterValidator:
    def check(value: float) -> float:
        if not (value >= lo and (hi is None or value <= hi)):  # NaN too
            raise Problem(
                f"must be between {lo} and {hi}, got {value}" if hi is not None else f"must be >= {lo}, got {value}"
            )
        return value

    return AfterValidator(check)


def _is_id(value: Any) -> bool:
    return type(value) is int


Count = Annotated[int, _between(1, MAX_N)]
Positive = Annotated[int, _between(1)]
Seed = Annotated[int, _between(INT64_MIN, INT64_MAX)]
Temperature = Annotated[float, _between(0, 2)]
Probability = Annotated[float, _between(0, 1)]
Penalty = Annotated[float, _between(-2, 2)]
TopLogprobs = Annotated[int, _between(0, MAX_TOP_LOGPROBS)]
NonEmpty = Annotated[str, Field(min_length=1)]


def _checked_by(check: Callable[[Any], None], kind: Any = Any) -> Any:
    """A field of type ``kind`` that ``check`` also accepts; None (the field left out) is not checked."""

    def validate(value: Any) -> Any:
        if value is not None:
            check(value)
        return value

    return Annotated[kind, AfterValidator(validate)]


def _check_stop(stop: Any) -> None:
    if not isinstance(stop, str) and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise Problem("must be a string or a list of strings")


def _check_content(content: Any) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise Problem("must be a string, a list of content parts or null")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise Problem("must be an object with a 'type'", j)
        if part["type"] in TEXT_PARTS and not isinstance(part.get("text"), str):
            raise Problem("a text part needs a string 'text'", j, "text")


def _check_chat_tool_choice(choice: Any) -> None:
    if choice in ("auto", "none", "required"):
        return
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise Problem("must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}")


def _check_response_format(fmt: Any) -> None:
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise Problem("must be {'type': 'text' | 'json_object' | 'json_schema', ...}")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("json_schema"), dict):
        raise Problem("is required for type 'json_schema' (an object with a schema)", "json_schema")


def _check_prompts(prompt: Any) -> None:
    batched = isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt)
    for one in prompt if batched else [prompt]:
        _check_prompt(one)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise Problem("must not be empty (there would be no prompt ids to condition on)")
        return
    if not isinstance(prompt, list) or not prompt or not all(_is_id(t) for t in prompt):
        raise Problem("must be a string, a non-empty list of token ids, or a list of those")
    if min(prompt) < 0 or max(prompt) > TOKEN_ID_MAX:
        bad = min(prompt) if min(prompt) < 0 else max(prompt)
        raise Problem(f"token ids must be between 0 and {TOKEN_ID_MAX}, got {bad}")


def _refuse_state(value: Any) -> None:
    raise Problem("the gateway keeps no conversation state: send the whole input instead")


def _refuse_background(value: bool) -> None:
    if value:
        raise Problem("background responses are not supported")


def _check_input(items: Any) -> None:
    if isinstance(items, str):
        return
    if not isinstance(items, list) or not items:
        raise Problem("must be a string or a non-empty list of input items")
    call_ids: set[str] = set()  # call ids of the function_call items so far
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise Problem("must be an object", i)
        kind = item.get("type", "message")
        if kind == "message":
            _check_input_message(item, i)
        elif kind == "function_call":
            _check_function_call(item, i)
            call_ids.add(item["call_id"])
        elif kind == "function_call_output":
            _check_function_call_output(item, i, call_ids)
        else:
            raise Problem(
                f"input items of type {kind!r} are not supported (message, function_call and function_call_output are)",
                i,
                "type",
            )


def _check_responses_tool_choice(choice: Any) -> None:
    if choice in ("auto", "none", "required"):
        return
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise Problem("must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _check_text(text: Any) -> None:
    if not isinstance(text, dict):
        raise Problem("must be an object")
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise Problem("must be 'text', 'json_object' or 'json_schema'", "format", "type")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("schema"), dict):
        raise Problem("is required for type 'json_schema' (an object)", "format", "schema")


Stop = _checked_by(_check_stop)
Content = _checked_by(_check_content)
ChatToolChoice = _checked_by(_check_chat_tool_choice)
ResponseFormat = _checked_by(_check_response_format)
Prompt = _checked_by(_check_prompts)
ResponsesInput = _checked_by(_check_input)
ResponsesToolChoice = _checked_by(_check_responses_tool_choice)
ResponsesText = _checked_by(_check_text)
Stateful = _checked_by(_refuse_state)
Background = _checked_by(_refuse_background, bool | None)


class _Body(BaseModel):
    """Strict JSON types (``"5"`` is not 5, ``true`` is not 1); unknown fields kept."""

    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = None


class FunctionCall(_Body):
    name: str
    arguments: str = Field(description="the arguments as JSON text")


class ToolCall(_Body):
    function: FunctionCall
    id: NonEmpty
    type: Literal["function"] = "function"


class FunctionSpec(_Body):
    name: NonEmpty


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionSpec


class Message(_Body):
    """A chat message. ``content`` is a string, a list of content parts (objects with a ``type``) or null."""

    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Content = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _roles(self) -> Message:
        if self.tool_calls is not None and self.role != "assistant":
            raise Problem("only assistant messages carry tool_calls", "tool_calls")
        if self.content is None and self.role != "assistant":
            raise Problem(f"is required on a {self.role} message", "content", code="missing_required_parameter")
        if self.role == "tool" and self.tool_call_id is None:
            raise Problem("is required on a tool message", "tool_call_id", code="missing_required_parameter")
        return self

    def text(self) -> str | None:
        """The content as one string (text parts joined); None for null content."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content)


class _Sampled(_Body):
    """The fields every request kind shares."""

    model: str | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    seed: Seed | None = None
    stop: Stop = None
    stream: bool | None = None


class Sampling(_Sampled):
    """The fields chat and completion requests share."""

    n: Count | None = None
    max_tokens: Positive | None = None
    max_completion_tokens: Positive | None = None
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # vLLM's extensions, which the engine also honours
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    return_token_ids: bool | None = None

    def stops(self) -> list[str]:
        """The stop strings as a list, empty ones left out."""
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop or [] if s]


class ChatCompletionRequest(Sampling):
    """A ``/v1/chat/completions`` body."""

    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ChatToolChoice = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    response_format: ResponseFormat = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None

    @model_validator(mode="after")
    def _links(self) -> ChatCompletionRequest:
        call_ids: set[str] = set()  # ids of the tool calls made so far
        for i, msg in enumerate(self.messages):
            call_ids.update(call.id for call in msg.tool_calls or [])
            if msg.role == "tool" and msg.tool_call_id not in call_ids:
                raise Problem(
                    f"{msg.tool_call_id!r} answers no tool call: a tool message must follow an assistant message "
                    "whose tool_calls has that id",
                    "messages",
                    i,
                    "tool_call_id",
                )
        choice = self.tool_choice
        if choice == "required" and not self.tools:
            raise Problem("'required' needs at least one tool in 'tools'", "tool_choice")
        if isinstance(choice, dict) and choice["function"]["name"] not in self.tool_names():
            raise Problem(f"names function {choice['function']['name']!r}, which is not in 'tools'", "tool_choice")
        return self

    def tool_names(self) -> set[str]:
        return {tool.function.name for tool in self.tools or []}


class CompletionRequest(Sampling):
    """A ``/v1/completions`` body: ``prompt`` is text, token ids, or a list of either."""

    prompt: Prompt = None
    logprobs: TopLogprobs | None = None
    echo: bool | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.prompt is None:
            raise Problem(
                "is required: a string or a non-empty list of token ids", "prompt", code="missing_required_parameter"
            )
        if self.echo:
            raise Problem("is not supported (prompt ids are returned separately)", "echo")
        if self.suffix:
            raise Problem("is not supported", "suffix")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one or more."""
        batched = isinstance(self.prompt, list) and isinstance(self.prompt[0], (str, list))
        return list(self.prompt) if batched else [self.prompt]


RESPONSES_PARTS = ("input_text", "output_text", "text", "summary_text", "refusal", "input_image")
"""The content part types a Responses message may hold."""


class ResponsesTool(_Body):
    type: Literal["function"]
    name: NonEmpty


class ResponsesRequest(_Sampled):
    """A ``/v1/responses`` body, as the gateway serves it: stateless (the whole input in each
    request), function tools only; an unknown field is refused. ``input`` items are
    ``message``, ``function_call`` and ``function_call_output``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    input: ResponsesInput = None
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ResponsesToolChoice = None
    max_output_tokens: Positive | None = None
    text: ResponsesText = None
    parallel_tool_calls: bool | None = None
    user: Any = None
    background: Background = None
    # the gateway keeps no conversation state: these are refused when given
    previous_response_id: Stateful = None
    conversation: Stateful = None
    prompt: Stateful = None
    # accepted and ignored
    store: Any = None
    metadata: Any = None
    include: Any = None
    truncation: Any = None
    reasoning: Any = None
    service_tier: Any = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    context_management: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    stream_options: Any = None

    @model_validator(mode="after")
    def _has_input(self) -> ResponsesRequest:
        if self.input is None:
            raise Problem(
                "is required: a string or a non-empty list of input items", "input", code="missing_required_parameter"
            )
        return self


def _check_input_message(item: dict, i: int) -> None:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise Problem(f"must be user, system, developer or assistant, got {role!r}", i, "role")
    _check_responses_content(item.get("content"), i)


def _check_responses_content(content: Any, *at: str | int) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise Problem("must be a string or a list of content parts", *at, "content")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in RESPONSES_PARTS or (kind == "input_image" and not part.get("image_url")):
            raise Problem(f"content part {kind!r} is not supported", *at, "content", j, "type")


def _check_function_call(item: dict, i: int) -> None:
    if item.get("arguments") is not None and not isinstance(item["arguments"], str):
        kind = type(item["arguments"]).__name__
        raise Problem(f"must be a string (the arguments as JSON text), got {kind}", i, "arguments")
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise Problem("is required (a string) on a function_call item", i, key)


def _check_function_call_output(item: dict, i: int, call_ids: set[str]) -> None:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise Problem("is required (a string) on a function_call_output item", i, "call_id")
    if call_id not in call_ids:
        raise Problem(f"no function_call item before this output has call_id {call_id!r}", i, "call_id")
    if not isinstance(item.get("output"), str):
        _check_responses_content(item.get("output"), i)


def validate(model: type[BaseModel], body: Any) -> Any:
    """``body`` as ``model``; :class:`InvalidRequest` naming the first field at fault."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", "must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _first_problem(exc) from None


_KINDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
}


def _first_problem(exc: ValidationError) -> InvalidRequest:
    err = exc.errors(include_url=False)[0]
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    code = "invalid_value"
    if kind == "value_error" and isinstance(err["ctx"]["error"], Problem):
        problem = err["ctx"]["error"]
        loc, reason, code = loc + problem.at, problem.reason, problem.code
    elif kind == "missing" or (value is None and kind in _KINDS):  # null where a value is required
        reason, code = "is required", "missing_required_parameter"
    elif kind == "extra_forbidden":
        reason, code = "unknown parameter", "unknown_parameter"
    elif kind in _KINDS:
        reason = f"must be {_KINDS[kind]}, got {type(value).__name__}"
    elif kind == "literal_error":
        reason = f"must be {err['ctx']['expected']}, got {value!r}"
    elif kind == "too_short":
        reason = "must not be empty"
    else:
        reason = err["msg"]
    return InvalidRequest(param_of(loc) or "body", reason, code)


def param_of(loc: tuple) -> str:
    """``("messages", 0, "role")`` as ``messages[0].role``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
