"""Anthropic's Messages API through the gateway in front of SmolLM2-135M-Instruct (slow: one model load).

The ``anthropic`` SDK and LangChain's ``ChatAnthropic`` talk to the gateway; the
transformers engine serves the policy. Every call is recorded with the ids of the chat
template's rendering of the translated conversation (tools by the engine's ``<tool_call>``
convention: SmolLM2's template has no tool section) and becomes a transition.
"""

from __future__ import annotations

import json

import anthropic
import pytest

import agl
from agl.capture import BufferedWriter
from agl.schema import Rollout, RolloutStatus, Task
from agl_trainer.gateway import Gateway
from agl_trainer.transitions import TransitionConfig, build_transitions
from tests.gateway.test_messages import CHAT_TOOLS, TOOLS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GREEDY = {"temperature": 0}  # the API takes it; this SDK version no longer names it


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture
def stack(sqlite_store, smollm2_engine):
    sqlite_store.add_tasks([Task(task_id="t", input={})])
    sqlite_store.enqueue([Rollout(rollout_id="ro-claude", task_id="t")])
    sqlite_store.claim("runner", limit=1)
    with Gateway(sqlite_store, smollm2_engine.urls, token="tok", model_version="smollm2") as gw:
        yield gw, sqlite_store, gw.rollout_key("ro-claude", sqlite_store.get_rollout("ro-claude").attempt)


def template_ids(tokenizer, messages, tools=None) -> list[int]:
    from agl_verl.engines.tools import ToolChoice, render_messages

    rendered = render_messages([dict(m) for m in messages], tools, ToolChoice("auto")) if tools else messages
    return list(tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_sdk_and_chat_anthropic_calls_are_transitions_with_the_templates_ids(stack, tokenizer):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage

    from agl_langchain import AglCallbackHandler

    gw, store, key = stack
    claude = anthropic.Anthropic(base_url=gw.rollout_anthropic_url("ro-claude"), api_key=key, max_retries=0)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    text = claude.messages.create(
        model="claude-sonnet-4-5", max_tokens=12, system="Be brief.", messages=question, extra_body=GREEDY
    )
    used = claude.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=48,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=question,
        extra_body=GREEDY,
    )
    [use] = [b for b in used.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict) and used.stop_reason == "tool_use"
    history = [
        *question,
        {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]},
    ]
    with claude.messages.stream(model="m", max_tokens=16, tools=TOOLS, messages=history, extra_body=GREEDY) as s:
        answer = s.get_final_message()
    writer = BufferedWriter(store, interval_s=0.05)
    chat_anthropic = ChatAnthropic(
        base_url=gw.rollout_anthropic_url("ro-claude"), api_key=key, model="claude-x", max_tokens=8, max_retries=0
    )
    with agl.use_rollout(agl.RolloutContext(rollout_id="ro-claude", writer=writer)):
        chat_anthropic.invoke([HumanMessage("Say hi.")], config={"callbacks": [AglCallbackHandler()]})
        agl.emit_reward(1.0)
    writer.close()
    gw.flush()

    calls = sorted(store.query_llm_calls(rollout_id="ro-claude"), key=lambda c: c.seq)
    assert [c.call_id for c in calls[:3]] == [text.id, used.id, answer.id] and len(calls) == 4
    said_hi = [{"role": "user", "content": "Say hi."}]
    sent_history = [
        *question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"},
    ]
    expected = [
        template_ids(tokenizer, [{"role": "system", "content": "Be brief."}, *question]),
        None,  # a named tool: the engine renders the tools for that choice (checked by its own tests)
        template_ids(tokenizer, sent_history, CHAT_TOOLS),
        template_ids(tokenizer, said_hi),
    ]
    for call, ids in zip(calls, expected, strict=True):
        assert call.endpoint == "messages" and call.model_version == "smollm2"
        if ids is not None:
            assert list(call.prompt_ids) == ids, call.call_id
        assert len(call.response_ids) > 0 and len(call.response_logprobs) == len(call.response_ids)
    assert tokenizer.decode(list(calls[0].response_ids), skip_special_tokens=True) == text.content[0].text
    assert answer.usage.input_tokens == len(calls[2].prompt_ids)

    [span] = store.query_spans(rollout_id="ro-claude", kind="llm")
    assert span.attributes["gen_ai.response.id"] == calls[3].call_id
    store.finish("ro-claude", RolloutStatus.SUCCEEDED, output="done")
    ts, report = build_transitions(store, [store.get_rollout("ro-claude")], TransitionConfig(missing_reward=0.0))
    assert report.joined_by_id == 1 and report.gateway_only == 3 and len(ts) == 4
    assert all(t.token_source == "engine" for t in ts)
    by_id = {c.call_id: c for c in calls}
    assert all(list(t.prompt_ids) == list(by_id[t.call_id].prompt_ids) for t in ts)


def _tool_runner_turns(claude, stream: bool) -> list:
    """The SDK's beta tool runner as its docs show it, threads on (its default), at most three turns."""
    from anthropic import beta_tool

    @beta_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        return f"Sunny, 21 C in {city}"

    runner = claude.beta.messages.tool_runner(
        model="claude-sonnet-4-5",
        max_tokens=48,
        max_iterations=3,
        tools=[get_weather],
        messages=[{"role": "user", "content": "What is the weather in Paris? Use get_weather."}],
        stream=stream,
        extra_body=GREEDY,
    )
    if not stream:
        return list(runner)
    turns = []
    for turn in runner:
        for _ in turn:
            pass
        turns.append(turn.get_final_message())
    return turns


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_the_sdks_tool_runner_runs_against_smollm2(stack, stream):
    """Whatever SmolLM2 answers, the runner gets through without an error from agl, and each turn is a call."""
    gw, store, key = stack
    claude = anthropic.Anthropic(base_url=gw.rollout_anthropic_url("ro-claude"), api_key=key, max_retries=0)
    turns = _tool_runner_turns(claude, stream)
    assert 1 <= len(turns) <= 3
    assert all(t.stop_reason in ("end_turn", "tool_use", "max_tokens") for t in turns)
    gw.flush()
    calls = sorted(store.query_llm_calls(rollout_id="ro-claude"), key=lambda c: c.seq)
    assert [c.call_id for c in calls] == [t.id for t in turns]
    assert all("thread" not in c.request for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_stop_sequences_against_smollm2(stack, stream):
    gw, _, key = stack
    claude = anthropic.Anthropic(base_url=gw.rollout_anthropic_url("ro-claude"), api_key=key, max_retries=0)
    body = {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "Name two colours."}]}

    def ask(**more):
        if not stream:
            return claude.messages.create(**body, **more, extra_body=GREEDY)
        with claude.messages.stream(**body, **more, extra_body=GREEDY) as s:
            return s.get_final_message()

    free = ask().content[0].text
    hits = sorted((free.find(s), s) for s in ("\n", ".") if s in free)
    assert hits, free  # greedy SmolLM2 writes a sentence or a line break within 40 tokens
    at, first = hits[0]
    msg = ask(stop_sequences=["\n", "."])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", first)
    assert "".join(b.text for b in msg.content) == free[:at]


def test_tool_arguments_stream_as_they_are_generated(stack):
    """SmolLM2 asked for a named tool (greedy): the call's arguments arrive in several ``input_json_delta``
    events, adding up to the input of the same call asked without streaming."""
    gw, store, key = stack
    claude = anthropic.Anthropic(base_url=gw.rollout_anthropic_url("ro-claude"), api_key=key, max_retries=0)
    body = {
        "model": "m",
        "max_tokens": 48,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "extra_body": GREEDY,
    }
    plain = claude.messages.create(**body)
    with claude.messages.stream(**body) as s:
        pieces = [e.partial_json for e in s if e.type == "input_json"]
        streamed = s.get_final_message()
    [use] = [b for b in plain.content if b.type == "tool_use"]
    [streamed_use] = [b for b in streamed.content if b.type == "tool_use"]
    assert streamed_use.input == use.input and streamed.stop_reason == plain.stop_reason == "tool_use"
    assert len(pieces) > 2 and json.loads("".join(pieces)) == use.input
    gw.flush()
    calls = sorted(store.query_llm_calls(rollout_id="ro-claude"), key=lambda c: c.seq)
    assert list(calls[0].response_ids) == list(calls[1].response_ids)
    assert calls[1].response["content"] == [b.model_dump(exclude_none=True) for b in streamed.content]
