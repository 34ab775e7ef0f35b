"""agl-autogen records the tools of an MCP server (McpWorkbench), the real calculator server over stdio."""

from __future__ import annotations

import json
import sys

from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams

from agl_autogen import AglChatCompletionClient
from tests.autogen.test_replay import MODEL_INFO


async def test_an_mcp_servers_tool_calls_are_tool_spans(recorded):
    from autogen_ext.models.replay import ReplayChatCompletionClient

    AglChatCompletionClient(ReplayChatCompletionClient([], model_info=MODEL_INFO))  # installs the hooks
    server = StdioServerParams(command=sys.executable, args=["-m", "mcp_server_calculator"], read_timeout_seconds=60)
    async with McpWorkbench(server) as calculator:
        ok = await calculator.call_tool("calculate", {"expression": "12 * 7"}, call_id="call-1")
        bad = await calculator.call_tool("calculate", {"expression": "__import__('os')"}, call_id="call-2")
    assert ok.to_text() == "84" and bad.is_error

    first, second = sorted(recorded.spans("tool"), key=lambda s: s.attributes["gen_ai.tool.call.id"])
    assert first.name == "execute_tool calculate" and first.status == "ok"
    assert json.loads(first.attributes["gen_ai.tool.call.arguments"]) == {"expression": "12 * 7"}
    assert first.attributes["gen_ai.tool.call.result"] == "84"
    assert second.status == "error" and second.attributes["error.type"] == "tool_error"
