"""The tool-call convention (agl_verl.engines.tools) and the tiny-model builder."""

from __future__ import annotations

import json

import pytest

from agl_verl.engines.tools import ToolChoice, forced_prefix, parse_tool_calls, render_messages, template_supports_tools

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_parse_two_calls_and_content():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    content, calls = parse_tool_calls(text, allowed={"get_weather"})
    assert content == "Let me check."
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_unterminated_last_call_counts_but_bad_json_or_unknown_name_does_not():
    assert parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {}}')[1]
    assert parse_tool_calls('<tool_call>\n{"name": "get_weather", "argu')[1] == []
    text = '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text, allowed={"get_weather"})
    assert calls == [] and content == text


def test_forced_prefixes():
    assert forced_prefix(ToolChoice("required")) == '<tool_call>\n{"name": "'
    named = forced_prefix(ToolChoice("function", "get_weather"))
    assert named == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert parse_tool_calls(named + '{"city": "Oslo"}}\n</tool_call>')[1][0]["function"]["name"] == "get_weather"
    assert forced_prefix(ToolChoice("auto")) == ""


def test_render_puts_tools_in_system_and_history_by_the_convention():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "2", "content": "rain"},
    ]
    out = render_messages(messages, TOOLS, ToolChoice("required"))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools")
    # one system prompt whatever the turn's choice: the turns of a conversation extend each other
    for choice in (ToolChoice("auto"), ToolChoice("function", "get_weather")):
        assert render_messages(messages, TOOLS, choice) == out
    assert out[2]["content"].count("<tool_call>") == 2
    assert out[3]["content"] == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
    none = render_messages(messages[:2], TOOLS, ToolChoice("none"))
    assert "# Tools" not in none[0]["content"]


def test_template_detection(tiny_model_dir):
    from transformers import AutoTokenizer

    assert not template_supports_tools(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_tiny_model_is_deterministic_and_round_trips(tmp_path):
    from transformers import AutoTokenizer

    from agl_verl.models import build_tiny_model

    corpus = ["2 + 3 = 5", "7 + 1 = 8"]
    a = build_tiny_model(tmp_path / "a", corpus, seed=5)
    b = build_tiny_model(tmp_path / "b", corpus, seed=5)
    c = build_tiny_model(tmp_path / "c", corpus, seed=6)
    weights = [(p / "model.safetensors").read_bytes() for p in (a, b, c)]
    assert weights[0] == weights[1] != weights[2]
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    tokenizer = AutoTokenizer.from_pretrained(a)
    text = 'what is 12 + 30?\n<tool_call>{"name": "x"}</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("123", add_special_tokens=False)) == ["1", "2", "3"]
    with pytest.raises(ValueError, match="corpus"):
        build_tiny_model(tmp_path / "d", [])


def test_forced_prefix_starts_the_named_functions_arguments():
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    add = {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    bare = {"type": "function", "function": {"name": "handoff", "parameters": {"type": "object", "properties": {}}}}
    assert forced_prefix(ToolChoice("function", "get_weather"), weather).endswith('"arguments": {"city": "')
    assert forced_prefix(ToolChoice("function", "add"), add).endswith('"arguments": {"a": ')
    whole = forced_prefix(ToolChoice("function", "handoff"), bare)
    assert parse_tool_calls(whole)[1][0]["function"] == {"name": "handoff", "arguments": "{}"}
    assert forced_prefix(ToolChoice("function", "get_weather"), TOOLS[0]).endswith('"arguments": ')


def test_a_call_cut_short_in_its_arguments_keeps_the_complete_members():
    text = (
        '<tool_call>\n{"name": "summarize", "arguments": {"text": "Owls hunt, at night.", '
        '"properties": {"type": "object", "description": "The ow'
    )
    (call,) = parse_tool_calls(text, allowed={"summarize"})[1]
    assert json.loads(call["function"]["arguments"]) == {"text": "Owls hunt, at night."}
    assert parse_tool_calls('<tool_call>\n{"name": "summarize", "arguments": {"text": "Owls hu')[1] == []


def test_a_complete_call_followed_by_stray_text_is_that_call():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}, "type": "function"}\n\nThe function is'
    (call,) = parse_tool_calls(text, allowed={"add"})[1]
    assert json.loads(call["function"]["arguments"]) == {"a": 12, "b": 30}
