"""The zero-line integration: patch AutoGen so every model client is captured.

:func:`instrument` installs two things, both undone by :func:`uninstrument`:

- structure hooks (also installed by :class:`~agl_autogen.AglChatCompletionClient`):
  AutoGen's own ``invoke_agent`` tracing context manager is wrapped so each agent
  invocation becomes an agl ``agent`` span and sets the current agent name; every
  team run (``BaseGroupChat.run_stream``, which ``run`` uses) becomes an ``agent``
  span naming the team type and its participants; ``BaseTool.run_json`` (every
  ``FunctionTool`` call an agent makes) and ``McpWorkbench.call_tool`` (an MCP
  server's tools, which do not go through ``run_json``) become ``tool`` spans; and a filter on
  AutoGen's event logger reads response ids;
- client hooks: ``create`` and ``create_stream`` of every ``ChatCompletionClient``
  class, those defined now and those defined later, record each call.

Setting ``AGL_AUTOGEN_INSTRUMENT=1`` calls :func:`instrument` at interpreter start:
the ``agl_autogen.pth`` file installed with the package imports
:mod:`agl_autogen._autoload`, which runs :func:`autoload`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from agl.capture import error_guard
from agl.capture.versions import check_version
from agl.env import AUTOGEN_INSTRUMENT
from agl.schema import now
from agl_autogen import _record, _response_ids

ENV_VAR = AUTOGEN_INSTRUMENT
"""Switch on (``1``, ``true``, ``yes``, ``on``; see :func:`agl.capture.env_flag`) to instrument at start."""

TESTED = "autogen-agentchat>=0.7,<0.8"
"""The AgentChat versions agl-autogen is tested with; the package installs up to ``<1``."""

_guard = error_guard("agl_autogen")


def check_framework_version() -> bool:
    """Whether AgentChat is in :data:`TESTED`; outside it warns once (raises if ``AGL_STRICT_VERSIONS=1``).

    Called by :func:`install_structure_hooks` (and so by :func:`instrument` and
    :class:`~agl_autogen.AglChatCompletionClient`) before any hook goes in.
    """
    return check_version(
        "agl_autogen",
        TESTED,
        still_works="AglChatCompletionClient and the client hooks of instrument() (every ChatCompletionClient's "
        "create and create_stream: messages, tools, output, usage, response ids), and tool spans "
        "(autogen_core's BaseTool.run_json)",
        may_break="the agent and team hooks on private AgentChat modules (agents._base_chat_agent, "
        "teams._group_chat), which give each call its agent name and each team run its span",
    )


_lock = threading.Lock()
_patches: list[tuple[Any, str, Any, bool]] = []  # (owner, attribute, original, owner had it in __dict__)
_structure = False
_clients = False
_MARK = "__agl_autogen_original__"


def _patch(owner: Any, attr: str, replacement: Any) -> None:
    had = attr in vars(owner)
    original = vars(owner).get(attr) if had else getattr(owner, attr, None)
    setattr(owner, attr, replacement)
    _patches.append((owner, attr, original, had))


def _wrap_invoke_agent(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    @contextlib.contextmanager
    def trace_invoke_agent_span(agent_name: str, **kwargs: Any) -> Iterator[Any]:
        agent_id = kwargs.get("agent_id")
        attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent_name}
        if agent_id:
            attrs["gen_ai.agent.id"] = agent_id
        if kwargs.get("agent_description"):
            attrs["gen_ai.agent.description"] = kwargs["agent_description"]
        with (
            _record.scope(f"invoke_agent {agent_name}", "agent", attrs, _record.AgentInfo(agent_name, agent_id)),
            original(agent_name, **kwargs) as otel_span,
        ):
            yield otel_span

    setattr(trace_invoke_agent_span, _MARK, original)
    return trace_invoke_agent_span


def _wrap_team_run_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run_stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_workflow"}
        try:
            name = getattr(self, "name", None) or type(self).__name__
            attrs["gen_ai.agent.name"] = name
            attrs["agl.team.type"] = type(self).__name__
            attrs["agl.team.participants"] = [getattr(p, "name", str(p)) for p in getattr(self, "_participants", [])]
        except Exception as exc:
            _guard.report("team attributes", exc)
            name = type(self).__name__
        with _record.scope(f"invoke_workflow {name}", "agent", attrs, None):
            async for item in original(self, *args, **kwargs):
                yield item

    setattr(run_stream, _MARK, original)
    return run_stream


def _wrap_run_json(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run_json(self: Any, args: Any, cancellation_token: Any, call_id: str | None = None) -> Any:
        def record(start: float, result: Any, exc: BaseException | None) -> None:
            _record.tool_span(self, args, call_id, start, result, exc)

        return await _recorded(original(self, args, cancellation_token, call_id=call_id), record)

    setattr(run_json, _MARK, original)
    return run_json


async def _recorded(call: Awaitable[Any], record: Callable[[float, Any, BaseException | None], None]) -> Any:
    """Await ``call``; then ``record(start, result, None)``, or ``record(start, None, error)`` and re-raise."""
    start = now()
    try:
        result = await call
    except BaseException as exc:
        record(start, None, exc)
        raise
    record(start, result, None)
    return result


def _wrap_workbench_call_tool(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def call_tool(
        self: Any, name: str, arguments: Any = None, cancellation_token: Any = None, call_id: str | None = None
    ) -> Any:
        def record(start: float, result: Any, exc: BaseException | None) -> None:
            _record.workbench_tool_span(name, arguments, call_id, start, result, exc)

        return await _recorded(original(self, name, arguments, cancellation_token, call_id), record)

    setattr(call_tool, _MARK, original)
    return call_tool


def _install_mcp_hook() -> None:
    """MCP servers' tools (``McpWorkbench``) skip ``BaseTool.run_json``: hook their ``call_tool``."""
    try:
        from autogen_ext.tools.mcp import McpWorkbench
    except ImportError:  # autogen-ext without its mcp extra: no MCP tools to record
        return
    _patch(McpWorkbench, "call_tool", _wrap_workbench_call_tool(McpWorkbench.call_tool))


def install_structure_hooks() -> None:
    """Install the agent, team and tool hooks and the event logger tap (idempotent)."""
    global _structure
    tested = check_framework_version()
    with _lock:
        if _structure:
            return
        try:
            from autogen_agentchat.agents import _base_chat_agent
            from autogen_agentchat.teams._group_chat import _base_group_chat, _chat_agent_container
            from autogen_core.tools import BaseTool

            for module in (_base_chat_agent, _chat_agent_container):
                _patch(module, "trace_invoke_agent_span", _wrap_invoke_agent(module.trace_invoke_agent_span))
            group_chat = _base_group_chat.BaseGroupChat
            _patch(group_chat, "run_stream", _wrap_team_run_stream(group_chat.run_stream))
            _patch(BaseTool, "run_json", _wrap_run_json(BaseTool.run_json))
            _install_mcp_hook()
            _response_ids.install_tap()
        except Exception as exc:
            if tested:
                raise
            # An untested AgentChat whose private modules moved: the client hooks still go in.
            _guard.report("install structure hooks on an untested AgentChat version", exc)
        _structure = True


def _wrap_create(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def create(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        opened = _record.begin_call(self, messages, kwargs.get("tools") or [], stream=False)
        try:
            result = await original(self, messages, *args, **kwargs)
        except BaseException as exc:
            _record.end_call(opened, None, exc)
            raise
        _record.end_call(opened, result, None)
        return result

    setattr(create, _MARK, original)
    return create


def _wrap_create_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    from agl_autogen.client import capture_stream

    @functools.wraps(original)
    def create_stream(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return capture_stream(self, original(self, messages, *args, **kwargs), messages, kwargs.get("tools") or [])

    setattr(create_stream, _MARK, original)
    return create_stream


def _patch_client_class(cls: type) -> None:
    from agl_autogen.client import AglChatCompletionClient

    if issubclass(cls, AglChatCompletionClient):
        return
    for attr, wrap in (("create", _wrap_create), ("create_stream", _wrap_create_stream)):
        method = vars(cls).get(attr)
        if method is None or getattr(method, "__isabstractmethod__", False) or hasattr(method, _MARK):
            continue
        _patch(cls, attr, wrap(method))


def _all_subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def instrument() -> None:
    """Capture every AutoGen model client, agent, team and tool from now on (idempotent)."""
    global _clients
    install_structure_hooks()
    with _lock:
        if _clients:
            return
        from autogen_core.models import ChatCompletionClient

        for cls in list(_all_subclasses(ChatCompletionClient)):
            _patch_client_class(cls)

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            super(ChatCompletionClient, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            try:
                with _lock:
                    _patch_client_class(cls)
            except Exception as exc:
                _guard.report("patch a new model client class", exc)

        _patch(ChatCompletionClient, "__init_subclass__", classmethod(__init_subclass__))
        _clients = True


def uninstrument() -> None:
    """Undo :func:`instrument` and the structure hooks."""
    global _structure, _clients
    with _lock:
        while _patches:
            owner, attr, original, had = _patches.pop()
            if had:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)
        _response_ids.remove_tap()
        _structure = _clients = False


def instrumented() -> bool:
    """Whether every model client is being captured."""
    return _clients


def autoload() -> bool:
    """The zero-line hook ``agl_autogen.pth`` runs at start: :func:`instrument` if ``AGL_AUTOGEN_INSTRUMENT`` is on.

    Returns whether it instrumented. A value :func:`agl.capture.env_flag` refuses is
    reported (a warning on the ``agl_autogen`` logger) and leaves capture off.
    """
    return _guard.instrument_if_on(ENV_VAR, instrument)
