"""A streamed chat choice's deltas (agl_verl.engines.chat_stream) add up to the plain answer's parse.

The model's output is scripted here as text growing a few characters at a time (what a
tokenizer's decode gives token by token); what a client accumulates from the deltas,
as OpenAI's and Anthropic's SDKs do, must equal what ``parse_tool_calls`` makes of the
whole output, and a call's arguments must arrive while they are written.
"""

from __future__ import annotations

import json

import pytest

from agl_verl.engines.chat_stream import ChatDeltas
from agl_verl.engines.tools import parse_tool_calls

ALLOWED = {"get_weather", "add"}


def accumulate(output: str, *, step: int = 3, parallel: bool = True, finish: str = "stop"):
    """Stream ``output`` ``step`` characters at a time: (content, calls by index, argument deltas per call, finish)."""
    stream = ChatDeltas(tools_active=True, allowed=ALLOWED, parallel=parallel)
    deltas = [stream.step(output[:n]) for n in range(step, len(output), step)]
    content, calls = parse_tool_calls(output, allowed=ALLOWED)
    message = {"role": "assistant", "content": content if calls else output}
    if not parallel:
        calls = calls[:1]
    last, finish = stream.last(message, calls, output, finish)
    text, got, pieces = "", {}, {}
    for delta in [*deltas, last]:
        text += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            call = got.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.get("id") or call["id"]
            call["name"] += tc.get("function", {}).get("name") or ""
            piece = tc.get("function", {}).get("arguments")
            call["arguments"] += piece or ""
            pieces.setdefault(tc["index"], []).extend([piece] if piece else [])
    return text, got, pieces, finish, (message, calls)


@pytest.mark.parametrize(
    "output",
    [
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": {"x": 1}, "b": [2, {"c": "}"}]}}\n</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome, Italy"}}</tool_call> done',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',  # EOS right after the JSON
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"Bergen"}}\n</tool_call>',  # compact JSON
    ],
)
def test_streamed_calls_add_up_to_the_parse_and_arguments_stream_as_written(output):
    text, got, pieces, finish, (message, calls) = accumulate(output)
    assert finish == "tool_calls" and len(got) == len(calls) > 0
    for k, call in enumerate(calls):
        assert got[k] == {
            "id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
        assert json.loads(got[k]["arguments"]) == json.loads(call["function"]["arguments"])
        assert len(pieces[k]) > 2  # the arguments came as they were written, not in one piece at the end
    assert text == (message["content"] or "")


def test_text_only_streams_as_it_comes_and_whole():
    output = "No call here, only a < sign and <tool a little further."
    text, got, _, finish, _ = accumulate(output)
    assert text == output and got == {} and finish == "stop"


def test_a_call_cut_short_stays_as_streamed_and_its_markup_is_not_sent_as_text():
    output = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    text, got, _, finish, (_, calls) = accumulate(output, finish="length")
    assert calls == [] and finish == "length"  # the parse finds no whole call
    assert got[0]["name"] == "get_weather" and got[0]["arguments"] == '{"city": "Par'
    assert text == "Checking."


def test_one_call_only_without_parallel_calls():
    output = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "B"}}</tool_call>'
    )
    _, got, _, _, (_, calls) = accumulate(output, parallel=False)
    assert list(got) == [0] and json.loads(got[0]["arguments"]) == {"city": "A"} and len(calls) == 1


def test_a_call_of_an_unknown_tool_is_not_streamed_as_a_call():
    output = '<tool_call>{"name": "launch", "arguments": {"n": 1}}</tool_call>'
    text, got, _, finish, _ = accumulate(output)
    assert got == {} and text == output and finish == "stop"
