"""The one-line integration: a model client wrapper that records every call."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Literal, TypedDict, Unpack

from autogen_core import CancellationToken
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    ModelCapabilities,
    ModelInfo,
    RequestUsage,
)
from autogen_core.tools import Tool, ToolSchema
from pydantic import BaseModel

from agl.capture import error_guard
from agl.capture.versions import UnsupportedVersionError
from agl_autogen import _record
from agl_autogen.structure import install_structure_hooks

_guard = error_guard("agl_autogen")


class CreateOptions(TypedDict, total=False):
    """The keyword arguments of ``ChatCompletionClient.create`` and ``create_stream``, passed on as given."""

    tools: Sequence[Tool | ToolSchema]
    tool_choice: Tool | Literal["auto", "required", "none"]
    json_output: bool | type[BaseModel] | None
    extra_create_args: Mapping[str, Any]
    cancellation_token: CancellationToken | None


class AglChatCompletionClient(ChatCompletionClient):
    """Wrap any AutoGen ``ChatCompletionClient`` so agl records each of its calls.

    >>> agent = AssistantAgent("solver", model_client=AglChatCompletionClient(client))

    Every ``create`` and ``create_stream`` becomes an agl ``llm`` span with the
    calling agent's name, the messages, tools, output, usage and (for OpenAI-style
    clients) the response id. Constructing one also installs agl's agent, team and
    tool hooks (:func:`agl_autogen.structure.install_structure_hooks`), which is
    what makes the agent name reliable. Everything else is delegated to ``inner``.
    """

    def __init__(self, inner: ChatCompletionClient):
        if not isinstance(inner, ChatCompletionClient):
            raise TypeError(f"inner: expected an autogen ChatCompletionClient, got {type(inner).__name__}")
        self.inner = inner
        """The wrapped client: every call goes to it."""
        try:
            install_structure_hooks()
        except UnsupportedVersionError:
            raise  # AGL_STRICT_VERSIONS=1 and an untested AgentChat: the user asked for an error
        except Exception as exc:
            _guard.report("install structure hooks", exc)

    async def create(self, messages: Sequence[LLMMessage], **options: Unpack[CreateOptions]) -> CreateResult:
        """``inner.create(messages, **options)``, recorded as an ``llm`` span (an error too, then raised again)."""
        opened = _record.begin_call(self.inner, messages, options.get("tools", []), stream=False)
        try:
            result = await self.inner.create(messages, **options)
        except BaseException as exc:
            _record.end_call(opened, None, exc)
            raise
        _record.end_call(opened, result, None)
        return result

    async def create_stream(
        self, messages: Sequence[LLMMessage], **options: Unpack[CreateOptions]
    ) -> AsyncGenerator[str | CreateResult, None]:
        """``inner.create_stream(messages, **options)``, chunks passed on as they come; recorded as one ``llm`` span."""
        stream = self.inner.create_stream(messages, **options)
        async for item in capture_stream(self.inner, stream, messages, options.get("tools", [])):
            yield item

    async def close(self) -> None:
        """Close ``inner``."""
        await self.inner.close()

    def actual_usage(self) -> RequestUsage:
        """``inner``'s usage, as it reports it."""
        return self.inner.actual_usage()

    def total_usage(self) -> RequestUsage:
        """``inner``'s total usage, as it reports it."""
        return self.inner.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """``inner``'s count of the tokens ``messages`` and ``tools`` take."""
        return self.inner.count_tokens(messages, tools=tools)

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """``inner``'s count of the tokens left in its context after ``messages`` and ``tools``."""
        return self.inner.remaining_tokens(messages, tools=tools)

    @property
    def capabilities(self) -> ModelCapabilities:  # type: ignore[override]
        """``inner``'s capabilities."""
        return self.inner.capabilities  # type: ignore[no-any-return]

    @property
    def model_info(self) -> ModelInfo:
        """``inner``'s model information."""
        return self.inner.model_info

    def __getattr__(self, name: str) -> Any:
        # Anything else the caller reaches for on the client (client-specific helpers).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


async def capture_stream(
    client: Any,
    stream: AsyncGenerator[str | CreateResult, None],
    messages: Sequence[Any],
    tools: Sequence[Any],
) -> AsyncGenerator[str | CreateResult, None]:
    """Pass a ``create_stream`` through, recording its final ``CreateResult``."""
    opened = _record.begin_call(client, messages, tools, stream=True)
    result: CreateResult | None = None
    try:
        async for item in stream:
            if isinstance(item, CreateResult):
                result = item
            yield item
    except BaseException as exc:
        _record.end_call(opened, None, exc)
        raise
    _record.end_call(opened, result, None)
