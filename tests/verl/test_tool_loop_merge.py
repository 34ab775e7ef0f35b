"""Two turns of one agent's tool loop through the real engine (SmolLM2) and gateway extend each other and merge.

The first turn must call the calculator (``tool_choice: "required"``), the second decides by
itself (``"auto"``), as an agent that resets its tool choice after a tool ran does. The
convention renders one system prompt for both (:mod:`agl_verl.engines.tools`), so the second
prompt's recorded ids begin with the first call's prompt and response ids, and the builder's
``merge="prefix"`` joins the two calls into one row.
"""

from __future__ import annotations

import json

import httpx
import pytest

from agl.schema import Transition
from agl_trainer.transitions.config import BuildReport
from agl_trainer.transitions.merge import merge_prefix

pytestmark = pytest.mark.slow

TOKEN = "merge-token"
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
EXAMPLE_CALL = {"name": "calculate", "arguments": json.dumps({"expression": "1250 + 340 - 75"})}
MESSAGES = [
    {
        "role": "system",
        "content": "Solve the problem with the calculate tool: pass it one expression for the whole problem.",
    },
    {"role": "user", "content": "A club has 1250 cards. It gets 340 more cards. It gives away 75 cards. How many now?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "ex", "type": "function", "function": EXAMPLE_CALL}]},
    {"role": "tool", "tool_call_id": "ex", "content": "1515"},
    {"role": "assistant", "content": "ANSWER: 1515"},
    {"role": "user", "content": "A shop has 1200 apples. It sells 345 apples. How many apples does it have now?"},
]


@pytest.fixture(scope="module")
def gateway(smollm2_engine, tmp_path_factory):
    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway

    with (
        SqliteStore(tmp_path_factory.mktemp("store") / "store.db") as store,
        Gateway(store, [smollm2_engine.urls[0]], token=TOKEN) as gw,
    ):
        yield gw


def chat(gateway, messages: list[dict], tool_choice: str) -> dict:
    body = {
        "model": "m",
        "messages": messages,
        "tools": [CALCULATE],
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 48,
    }
    response = httpx.post(
        f"{gateway.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300
    )
    assert response.status_code == 200, response.text
    return response.json()


def as_transition(call, step: int) -> Transition:
    """A gateway record as the builder turns it into a transition (one agent, one rollout)."""
    return Transition(
        rollout_id="r",
        task_id="t",
        step=step,
        agent="solver",
        prompt_ids=call.prompt_ids,
        response_ids=call.response_ids,
        response_logprobs=call.response_logprobs,
        reward=1.0,
        model_version=call.model_version,
        call_id=call.call_id,
    )


def test_a_required_call_and_the_auto_turn_after_it_extend_each_other_and_merge(gateway):
    first = chat(gateway, MESSAGES, "required")
    message = first["choices"][0]["message"]
    assert message["tool_calls"], message  # forced: a parsed calculator call
    history = MESSAGES + [
        {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "855"},
    ]
    second = chat(gateway, history, "auto")
    gateway.flush()
    calls = {c.call_id: c for c in gateway.store.query_llm_calls(production=True)}
    one, two = calls[first["id"]], calls[second["id"]]

    prefix = list(one.prompt_ids) + list(one.response_ids)
    assert list(two.prompt_ids)[: len(prefix)] == prefix
    assert len(two.prompt_ids) > len(prefix)  # the tool result follows

    report = BuildReport()
    (row,) = merge_prefix([as_transition(one, 0), as_transition(two, 1)], report)
    assert report.merged_calls == 1 and report.merge_breaks == {}
    assert list(row.prompt_ids) == list(one.prompt_ids)
    assert list(row.response_ids) == list(two.prompt_ids)[len(one.prompt_ids) :] + list(two.response_ids)
    assert [(s.start, s.end) for s in row.segments] == [
        (0, len(one.response_ids)),
        (len(two.prompt_ids) - len(one.prompt_ids), len(row.response_ids)),
    ]
