"""Recording an AutoGen run as agl spans: model calls, agents, teams and tools.

The calling agent is known from a context variable set wherever AutoGen opens its
own ``invoke_agent`` OpenTelemetry span (see :mod:`agl_autogen.instrument`); when
that hook is not installed, the current recording OpenTelemetry span named
``invoke_agent <name>`` or the runtime's ``MessageHandlerContext`` stand in.
The model call in flight (:data:`pending_call`) is where
:mod:`agl_autogen._response_ids` leaves the response id it reads.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import agl
from agl.capture import error_guard
from agl.schema import Span, now
from agl_autogen import convert

_guard = error_guard("agl_autogen")


@dataclass(frozen=True)
class AgentInfo:
    """The agent a piece of work runs for."""

    name: str
    agent_id: str | None = None


current_agent: contextvars.ContextVar[AgentInfo | None] = contextvars.ContextVar("agl_autogen_agent", default=None)


@dataclass
class PendingCall:
    """A model call in flight: what the event logger tap fills in."""

    start: float
    response: dict[str, Any] | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


pending_call: contextvars.ContextVar[PendingCall | None] = contextvars.ContextVar("agl_autogen_call", default=None)


def agent_info() -> AgentInfo | None:
    """The calling agent, from agl's hook, OpenTelemetry or AutoGen's runtime."""
    info = current_agent.get()
    if info is not None:
        return info
    try:
        from opentelemetry import trace

        otel_span = trace.get_current_span()
        name = getattr(otel_span, "name", None)
        if isinstance(name, str) and name.startswith("invoke_agent "):
            attrs = getattr(otel_span, "attributes", None) or {}
            return AgentInfo(name[len("invoke_agent ") :], attrs.get("gen_ai.agent.id"))
    except Exception as exc:
        _guard.report("agent name from OpenTelemetry", exc)
    try:
        from autogen_core import MessageHandlerContext

        agent_id = MessageHandlerContext.agent_id()
    except RuntimeError:  # not inside a runtime's message handler
        return None
    return AgentInfo(runtime_agent_name(agent_id.type, agent_id.key), str(agent_id))


def runtime_agent_name(agent_type: str, key: str) -> str:
    """The name behind a runtime agent type, without the team's per-run suffix.

    AgentChat teams register each participant and their manager as the agent type
    ``<name>_<team id>`` with the team id (a fresh UUID per team) as key, so a
    SelectorGroupChat's speaker-selection calls are made by
    ``SelectorGroupChatManager_<uuid>``; the name is the part before the suffix.
    Agent types from a plain ``autogen_core`` runtime are returned as they are.
    """
    suffix = f"_{key}"
    if key and agent_type.endswith(suffix) and len(agent_type) > len(suffix):
        return agent_type[: -len(suffix)]
    return agent_type


# -- model calls ---------------------------------------------------------------------


def model_name(client: Any) -> str | None:
    """The model a client asks for, where the client says."""
    create_args = getattr(client, "_create_args", None)
    if isinstance(create_args, dict) and isinstance(create_args.get("model"), str):
        return create_args["model"]
    try:
        info = client.model_info
        family = info.get("family") if isinstance(info, dict) else None
        return family if isinstance(family, str) and family != "unknown" else None
    except Exception:
        return None


def begin_call(
    client: Any, messages: Sequence[Any], tools: Sequence[Any], *, stream: bool
) -> tuple[PendingCall, contextvars.Token] | None:
    """Open a model call; None (and nothing recorded) if one is already open in this task."""
    if pending_call.get() is not None:
        return None  # a client calling another client: the outer call records it
    try:
        call = PendingCall(start=now())
        attrs = call.attributes
        attrs["gen_ai.operation.name"] = "chat"
        model = model_name(client)
        if model:
            attrs["gen_ai.request.model"] = model
        info = agent_info()
        if info is not None:
            attrs["gen_ai.agent.name"] = info.name
            if info.agent_id:
                attrs["gen_ai.agent.id"] = info.agent_id
        attrs["gen_ai.input.messages"] = convert.input_messages(messages)
        if tools:
            attrs["gen_ai.tool.definitions"] = convert.tool_definitions(tools)
        attrs["agl.stream"] = stream
        attrs["agl.client"] = type(client).__name__
        return call, pending_call.set(call)
    except Exception as exc:
        _guard.report("model call start", exc)
        return None


def end_call(opened: tuple[PendingCall, contextvars.Token] | None, result: Any, error: BaseException | None) -> None:
    """Close a model call opened by :func:`begin_call` and record its span."""
    if opened is None:
        return
    call, token = opened
    try:
        pending_call.reset(token)
    except ValueError:  # closed from another context (a stream finished elsewhere)
        pending_call.set(None)
    try:
        attrs = call.attributes
        response = call.response
        if response:
            if isinstance(response.get("id"), str):
                attrs["gen_ai.response.id"] = response["id"]
            if isinstance(response.get("model"), str):
                attrs["gen_ai.response.model"] = response["model"]
        status = "ok"
        if error is not None:
            status = "error"
            attrs["error.type"] = type(error).__name__
            attrs["error.message"] = str(error)
        elif result is not None:
            attrs["gen_ai.output.messages"] = convert.output_messages(result)
            attrs["gen_ai.response.finish_reasons"] = [result.finish_reason]
            attrs["gen_ai.usage.input_tokens"] = result.usage.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = result.usage.completion_tokens
            if result.cached:
                attrs["agl.cached"] = True
        model = attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model")
        span = Span(
            name=f"chat {model}" if model else "chat",
            kind="llm",
            start_time=call.start,
            end_time=now(),
            status=status,
            attributes=attrs,
        )
    except Exception as exc:
        _guard.report("model call end", exc)
        return
    _guard.emit(span)


# -- agents, teams, tools --------------------------------------------------------------


@contextlib.contextmanager
def scope(name: str, kind: str, attributes: dict[str, Any], agent: AgentInfo | None) -> Iterator[None]:
    """An agl span around a block, with ``agent`` as the current agent inside.

    The user's exceptions pass through untouched; agl's own failures are reported.
    """
    cm = None
    agent_token = None
    try:
        cm = agl.span(name, kind=kind, **attributes)  # type: ignore[arg-type]
        cm.__enter__()
        if agent is not None:
            agent_token = current_agent.set(agent)
    except Exception as exc:
        _guard.report(f"{kind} span start", exc)
    try:
        yield
    except BaseException as exc:
        _close(cm, agent_token, exc)
        raise
    else:
        _close(cm, agent_token, None)


def _close(cm: Any, agent_token: contextvars.Token | None, error: BaseException | None) -> None:
    if agent_token is not None:
        try:
            current_agent.reset(agent_token)
        except ValueError:
            current_agent.set(None)
    if cm is None:
        return
    try:
        if error is None:
            cm.__exit__(None, None, None)
        else:
            cm.__exit__(type(error), error, error.__traceback__)
    except BaseException as exc:
        if exc is not error:
            _guard.report("span end", exc)


def tool_span(
    tool: Any, args: Any, call_id: str | None, start: float, result: Any, error: BaseException | None
) -> None:
    """Record one execution of an AutoGen ``BaseTool`` (``run_json``)."""
    try:
        text = tool.return_value_as_string(result) if error is None else None
    except Exception as exc:
        _guard.report("tool span", exc)
        return
    _emit_tool_span(tool.name, args, call_id, start, text, type(error).__name__ if error is not None else None)


def workbench_tool_span(
    name: str, args: Any, call_id: str | None, start: float, result: Any, error: BaseException | None
) -> None:
    """Record one tool call through a workbench that does not go through ``run_json`` (an MCP
    server's tools): a ``ToolResult`` flagged ``is_error`` is recorded as an error, as a raise is."""
    try:
        text = result.to_text() if result is not None else None
        failed = type(error).__name__ if error is not None else ("tool_error" if result.is_error else None)
    except Exception as exc:
        _guard.report("tool span", exc)
        return
    _emit_tool_span(name, args, call_id, start, text, failed)


def _emit_tool_span(
    name: str, args: Any, call_id: str | None, start: float, result: str | None, error_type: str | None
) -> None:
    try:
        attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        if call_id:
            attrs["gen_ai.tool.call.id"] = call_id
        try:
            attrs["gen_ai.tool.call.arguments"] = json.dumps(dict(args or {}), default=str)
        except Exception:
            attrs["gen_ai.tool.call.arguments"] = str(args)
        info = current_agent.get()
        if info is not None:
            attrs["gen_ai.agent.name"] = info.name
        if error_type is not None:
            attrs["error.type"] = error_type
        if result is not None:
            attrs["gen_ai.tool.call.result"] = result
        span = Span(
            name=f"execute_tool {name}",
            kind="tool",
            start_time=start,
            end_time=now(),
            status="error" if error_type is not None else "ok",
            attributes=attrs,
        )
    except Exception as exc:
        _guard.report("tool span", exc)
        return
    _guard.emit(span)
