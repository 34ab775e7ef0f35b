"""Multi-turn continuity of recorded token ids."""

from __future__ import annotations

from agl.schema import LLMCall
from agl_trainer.gateway.continuity import check_continuity, report


def call(i: int, prompt: list[int], response: list[int]) -> LLMCall:
    return LLMCall(call_id=f"c{i}", seq=i, prompt_ids=prompt, response_ids=response)


def test_extending_turns_are_reported_as_extends():
    a = call(0, [1, 2, 3], [4, 5])
    b = call(1, [1, 2, 3, 4, 5, 6, 7], [8])
    c = call(2, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10])
    results = check_continuity([a, b, c])
    assert [r.status for r in results] == ["new", "extends", "extends"]
    assert [r.previous for r in results] == [None, "c0", "c1"] and results[2].shared == 8
    assert all(r.mismatch is None for r in results)


def test_rewritten_response_is_reported_with_position_and_windows():
    a = call(0, [1, 2, 3, 4], [50, 51, 52, 53])
    b = call(1, [1, 2, 3, 4, 50, 99, 52, 53, 7], [8])  # the model's output re-tokenized differently
    [_, r] = check_continuity([a, b], window=2)
    assert r.status == "rewritten" and r.previous == "c0"
    m = r.mismatch
    assert m.position == 5 and m.in_response
    assert m.window_start == 3 and m.expected == [4, 50, 51, 52] and m.actual == [4, 50, 99, 52]
    text = report([_, r])
    assert "rewritten" in text and "at token 5" in text and "previous response" in text


def test_rewritten_history_in_the_prompt():
    a = call(0, [1, 2, 3, 4, 5, 6], [7])
    b = call(1, [1, 2, 3, 4, 0, 6, 7, 8], [9])  # an earlier message was edited
    [_, r] = check_continuity([a, b])
    assert r.status == "rewritten" and r.mismatch.position == 4 and not r.mismatch.in_response
    assert "previous prompt" in r.mismatch.describe()
    assert r.mismatch.describe(decode=lambda ids: ",".join(map(str, ids))).count("'") == 4


def test_unrelated_context_is_new_and_the_best_predecessor_wins():
    a = call(0, [1, 2, 3, 4, 5, 6], [7])
    sub = call(1, [1, 9, 9, 9], [10])  # another sub-agent: shares only a template token
    back = call(2, [1, 2, 3, 4, 5, 6, 7, 11], [12])  # the first agent continues after the sub-agent
    results = check_continuity([a, sub, back])
    assert [r.status for r in results] == ["new", "new", "extends"]
    assert results[1].previous is None and results[2].previous == "c0"


def test_gateway_records_of_a_tool_loop_extend(client, gateway, store, rollout):
    from tests.gateway.conftest import calls_of

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "call add"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=tools)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id, "content": "3"},
    ]
    client.chat.completions.create(model="m", messages=messages, tools=tools)
    # (the edited answer keeps its tool call: a tool message must answer one, as OpenAI requires)
    answer = {"role": "assistant", "content": "I will add", "tool_calls": messages[1]["tool_calls"]}
    edited = [dict(messages[0]), answer, messages[2]]
    client.chat.completions.create(model="m", messages=edited, tools=tools)
    calls = calls_of(gateway, store, rollout)
    results = check_continuity(calls)
    assert [r.status for r in results] == ["new", "extends", "rewritten"]
    # the edit replaced the model's first answer: the ids part where that answer began
    assert results[2].previous == calls[1].call_id and results[2].mismatch.position == len(calls[0].prompt_ids)
