"""One model of the Anthropic Messages request bodies the gateway serves.

:class:`MessagesRequest` is a ``POST /v1/messages`` body and :class:`CountTokensRequest` a
``POST /v1/messages/count_tokens`` body, as Anthropic's API reference and the ``anthropic``
SDK's ``MessageCreateParams`` / ``MessageCountTokensParams`` describe them. The gateway
(:mod:`agl_trainer.gateway.messages_api`) turns a checked body into the engine's chat
request. A bad body raises :class:`agl_trainer.openai_requests.InvalidRequest` naming the
field (``messages[1].content[0].tool_use_id``) and the reason, as the OpenAI models do.

What the gateway serves, and what it refuses rather than drop:

- ``model`` and ``max_tokens`` are required (``max_tokens`` from 1: there is no prompt
  cache to warm with 0); ``temperature`` and ``top_p`` 0 to 1, ``top_k`` from 0.
- Messages are ``user`` or ``assistant``; content is a string or blocks: ``text`` and
  ``image`` anywhere, ``tool_use`` (``id``, ``name``, an object ``input``) in assistant
  messages, ``tool_result`` (``tool_use_id`` of an earlier ``tool_use``, ``content`` a
  string or text/image blocks, ``is_error``) in user messages. Other block types
  (``document``, ``thinking``, server tool results, ...) are refused naming the block.
- ``system`` is a string or text blocks; ``tools`` are custom tools (``name``,
  ``input_schema``, ``description``); server tools (``web_search_...``) are refused.
  ``tool_choice`` is ``auto``, ``any``, ``tool`` (with ``name``) or ``none``, with
  ``disable_parallel_tool_use``.
- ``output_config.format`` (a JSON schema) is served as the engine's structured output.
- A last message of role ``assistant`` is a prefill: the answer continues it.
- Refused: ``thread`` (message threads; the 400 carries ``error.details.error_code``
  ``thread_unsupported_request``, on which the SDK's tool runner resends the whole
  history unthreaded), and ``thinking`` other than ``{"type": "disabled"}`` (the policy
  writes no thinking blocks).
- Accepted and ignored (they do not change what the policy samples): ``metadata``
  (its ``user_id`` is passed on), ``service_tier``, ``cache_control``,
  ``inference_geo``, ``speed``, ``diagnostics``, ``user_profile_id``, ``workspace_id``,
  ``output_config.effort``. Any other field is refused as an unknown parameter, as
  Anthropic's API does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agl_trainer.openai_requests import NonEmpty, Positive, Probability, Problem, _between, _checked_by

ROLES = ("user", "assistant")
USER_BLOCKS = ("text", "image", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use")
RESULT_BLOCKS = ("text", "image")
"""The block types a ``tool_result``'s content may hold."""

_REQUIRED = {
    "text": {"text": str},
    "image": {"source": dict},
    "tool_use": {"id": str, "name": str, "input": dict},
    "tool_result": {"tool_use_id": str},
}
_KIND_NAMES = {str: "a string", dict: "an object"}
THREAD_UNSUPPORTED = "thread_unsupported_request"
"""The ``error.details.error_code`` of a refused ``thread``: the SDK then resends without one."""


def _check_block(block: Any, allowed: tuple[str, ...], *at: str | int) -> None:
    """One content block: its type among ``allowed`` and its required fields of the right types."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise Problem("must be an object with a string 'type'", *at)
    kind = block["type"]
    if kind not in allowed:
        raise Problem(f"content blocks of type {kind!r} are not supported here ({', '.join(allowed)} are)", *at, "type")
    for name, want in _REQUIRED[kind].items():
        value = block.get(name)
        if value is None:
            raise Problem(f"is required on a {kind} block", *at, name, code="missing_required_parameter")
        if not isinstance(value, want):
            raise Problem(f"must be {_KIND_NAMES[want]}, got {type(value).__name__}", *at, name)
        if want is str and name != "text" and not value:
            raise Problem("must not be empty", *at, name)
    if kind == "image":
        _check_image_source(block["source"], *at, "source")
    elif kind == "tool_result":
        _check_result(block, *at)


def _check_image_source(source: dict, *at: str | int) -> None:
    kind = source.get("type")
    if kind == "base64":
        if not isinstance(source.get("media_type"), str) or not isinstance(source.get("data"), str):
            raise Problem("a base64 image source needs a string 'media_type' and 'data'", *at)
    elif kind == "url":
        if not isinstance(source.get("url"), str):
            raise Problem("a url image source needs a string 'url'", *at, "url")
    else:
        raise Problem(f"must be 'base64' or 'url', got {kind!r}", *at, "type")


def _check_result(block: dict, *at: str | int) -> None:
    content = block.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            raise Problem("must be a string or a list of text and image blocks", *at, "content")
        for k, part in enumerate(content):
            _check_block(part, RESULT_BLOCKS, *at, "content", k)
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise Problem(f"must be true or false, got {type(block['is_error']).__name__}", *at, "is_error")


def _check_system(system: Any) -> None:
    if isinstance(system, str):
        return
    if not isinstance(system, list):
        raise Problem("must be a string or a list of text blocks")
    for j, block in enumerate(system):
        _check_block(block, ("text",), j)


def _check_content(content: Any) -> None:
    """A message's content: a string or a list of blocks (which blocks a role may send is the request's check)."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise Problem("must be a string or a list of content blocks")
    for j, block in enumerate(content):
        _check_block(block, tuple(_REQUIRED), j)


System = _checked_by(_check_system)
Content = _checked_by(_check_content)
UnitInterval = Annotated[float, _between(0, 1)]
TopK = Annotated[int, _between(0)]


class _Strict(BaseModel):
    """Strict JSON types; an unknown field is refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


class _Open(BaseModel):
    """Strict JSON types; unknown fields kept (tool definitions and metadata grow new ones)."""

    model_config = ConfigDict(strict=True, extra="allow")


class Message(_Open):
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Content

    @model_validator(mode="after")
    def _has_content(self) -> Message:
        if self.content is None:
            raise Problem(
                "is required: a string or a list of content blocks", "content", code="missing_required_parameter"
            )
        allowed = USER_BLOCKS if self.role == "user" else ASSISTANT_BLOCKS
        for j, block in enumerate(self.content if isinstance(self.content, list) else []):
            if block["type"] not in allowed:
                where = "a user" if self.role == "assistant" else "an assistant"
                raise Problem(f"a {block['type']} block belongs in {where} message", "content", j, "type")
        return self

    def blocks(self) -> list[dict]:
        """The content as blocks (a string is one text block)."""
        return [{"type": "text", "text": self.content}] if isinstance(self.content, str) else self.content


class Tool(_Open):
    """A custom tool; a server tool (``web_search_20250305``, ``bash_...``) is refused by its type."""

    type: Literal["custom"] | None = None
    name: NonEmpty
    input_schema: dict[str, Any]
    description: str | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: NonEmpty | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and self.name is None:
            raise Problem("is required for type 'tool'", "name", code="missing_required_parameter")
        return self


class Metadata(_Open):
    user_id: str | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Any = None  # accepted and ignored: the policy has one effort
    format: OutputFormat | None = None


class CountTokensRequest(_Strict):
    """A ``/v1/messages/count_tokens`` body: the conversation without sampling settings."""

    model: NonEmpty
    messages: list[Message] = Field(min_length=1)
    system: System = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: Any = None  # only {"type": "disabled"}: see _no_thinking
    # accepted and ignored
    cache_control: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    @model_validator(mode="after")
    def _no_thinking(self) -> CountTokensRequest:
        kind = self.thinking.get("type") if isinstance(self.thinking, dict) else self.thinking
        if self.thinking is not None and kind != "disabled":
            raise Problem(
                f"extended thinking ({kind!r}) is not served: the policy under training writes no thinking "
                "blocks; leave 'thinking' out or send {'type': 'disabled'}",
                "thinking",
                code="unsupported_feature",
            )
        return self

    @model_validator(mode="after")
    def _links(self) -> CountTokensRequest:
        used: set[str] = set()  # ids of the tool_use blocks so far
        for i, message in enumerate(self.messages):
            for j, block in enumerate(message.blocks()):
                if block["type"] == "tool_use":
                    used.add(block["id"])
                elif block["type"] == "tool_result" and block["tool_use_id"] not in used:
                    raise Problem(
                        f"{block['tool_use_id']!r} answers no tool_use: a tool_result must follow an assistant "
                        "message with a tool_use block of that id",
                        "messages",
                        i,
                        "content",
                        j,
                        "tool_use_id",
                    )
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not self.tools:
            raise Problem(f"{choice.type!r} needs at least one tool in 'tools'", "tool_choice", "type")
        if choice is not None and choice.type == "tool" and choice.name not in {t.name for t in self.tools or []}:
            raise Problem(f"names tool {choice.name!r}, which is not in 'tools'", "tool_choice", "name")
        return self


class MessagesRequest(CountTokensRequest):
    """A ``/v1/messages`` body."""

    max_tokens: Positive
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: UnitInterval | None = None
    top_p: Probability | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    thread: Any = None  # refused below, in the shape the SDK's tool runner falls back on
    # accepted and ignored
    service_tier: Any = None
    inference_geo: Any = None
    diagnostics: Any = None

    @model_validator(mode="after")
    def _unthreaded(self) -> MessagesRequest:
        if self.thread is not None:
            raise Problem(
                "message threads are not served here: send the whole conversation in 'messages' "
                "(the anthropic SDK does so on its own after this error)",
                "thread",
                code=THREAD_UNSUPPORTED,
            )
        return self
