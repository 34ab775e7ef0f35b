"""The structure hooks: agents, teams and tools as agl spans, and the response ids AutoGen logs.

:func:`install_structure_hooks` wraps AutoGen's own ``invoke_agent`` tracing context
manager so each agent invocation becomes an agl ``agent`` span and sets the current
agent name; every team run (``BaseGroupChat.run_stream``, which ``run`` uses) becomes an
``agent`` span naming the team type and its participants; ``BaseTool.run_json`` (every
``FunctionTool`` call an agent makes) and ``McpWorkbench.call_tool`` (an MCP server's
tools, which do not go through ``run_json``) become ``tool`` spans; and a filter on
AutoGen's event logger reads response ids. Both :class:`~agl_autogen.AglChatCompletionClient`
and :func:`agl_autogen.instrument` install them; :func:`agl_autogen.uninstrument` removes them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from agl.capture import error_guard
from agl.capture.patching import Patches
from agl.capture.versions import check_version
from agl.schema import now
from agl_autogen import _record, _response_ids

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
_patches = Patches()
_installed = False


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

    return run_stream


def _wrap_run_json(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run_json(self: Any, args: Any, cancellation_token: Any, call_id: str | None = None) -> Any:
        def record(start: float, result: Any, exc: BaseException | None) -> None:
            _record.tool_span(self, args, call_id, start, result, exc)

        return await _recorded(original(self, args, cancellation_token, call_id=call_id), record)

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

    return call_tool


def _install_mcp_hook() -> None:
    """MCP servers' tools (``McpWorkbench``) skip ``BaseTool.run_json``: hook their ``call_tool``."""
    try:
        from autogen_ext.tools.mcp import McpWorkbench
    except ImportError:  # autogen-ext without its mcp extra: no MCP tools to record
        return
    _patches.wrap(McpWorkbench, "call_tool", _wrap_workbench_call_tool)


def install_structure_hooks() -> None:
    """Install the agent, team and tool hooks and the event logger tap (idempotent)."""
    global _installed
    tested = check_framework_version()
    with _lock:
        if _installed:
            return
        try:
            from autogen_agentchat.agents import _base_chat_agent
            from autogen_agentchat.teams._group_chat import _base_group_chat, _chat_agent_container
            from autogen_core.tools import BaseTool

            for module in (_base_chat_agent, _chat_agent_container):
                _patches.wrap(module, "trace_invoke_agent_span", _wrap_invoke_agent)
            _patches.wrap(_base_group_chat.BaseGroupChat, "run_stream", _wrap_team_run_stream)
            _patches.wrap(BaseTool, "run_json", _wrap_run_json)
            _install_mcp_hook()
            _response_ids.install_tap()
        except Exception as exc:
            if tested:
                raise
            # An untested AgentChat whose private modules moved: the client hooks still go in.
            _guard.report("install structure hooks on an untested AgentChat version", exc)
        _installed = True


def remove_structure_hooks() -> None:
    """Undo :func:`install_structure_hooks` (idempotent)."""
    global _installed
    with _lock:
        _patches.undo()
        _response_ids.remove_tap()
        _installed = False
