"""Issue 7: agents written the way the frameworks' quickstarts write them, run unmodified against the gateway.

Each agent in ``agents/`` knows nothing about agl: it reads its endpoint from the
standard environment variables, which ``agl run`` sets for one rollout, and agl
captures it through the integration's zero-line switch. The model is
SmolLM2-135M-Instruct served by the transformers engine, whose chat template has no
tool section: tools reach it by the engine's ``<tool_call>`` convention.

For every agent: each LLM call it made is a gateway record with engine token ids and
logprobs, and becomes a transition with ``token_source == "engine"`` and the agent
name the framework gives (None with tracing off). Where the agent asks for a tool
(``tool_choice`` required or named), the tool ran.
"""

from __future__ import annotations

import json

import pytest

from agl_trainer.transitions import TransitionConfig, build_transitions

pytestmark = pytest.mark.slow

LANGCHAIN = {"AGL_LANGCHAIN_INSTRUMENT": "1"}
AUTOGEN = {"AGL_AUTOGEN_INSTRUMENT": "1"}
AGENTS_SDK = {"AGL_OPENAI_AGENTS_INSTRUMENT": "1"}


def finished(stack, run):
    assert run.returncode == 0, f"agl run failed ({run.returncode})\n{run.stdout}\n{run.stderr[-4000:]}"
    rollout = stack.store.get_rollout(run.rollout_id)
    assert rollout.status.value == "succeeded", rollout.error
    return rollout


def engine_calls(stack, run, model_calls: int):
    """The gateway's records of the run: one per LLM call, each with engine token ids and logprobs."""
    calls = sorted(stack.store.query_llm_calls(rollout_id=run.rollout_id), key=lambda c: c.seq)
    assert len(calls) == model_calls, [c.call_id for c in calls]
    for c in calls:
        assert len(c.prompt_ids) > 0 and len(c.response_ids) > 0, c.call_id
        assert c.response_logprobs is not None and len(c.response_logprobs) == len(c.response_ids)
        assert all(lp <= 0.0 for lp in c.response_logprobs)
        assert c.model_version == "smollm2-base"
    return calls


def transitions_of(stack, rollout, calls):
    """Transitions of the rollout: one per call, in call order, from the engine's token ids."""
    ts, report = build_transitions(stack.store, [rollout], TransitionConfig(missing_reward=0.0))
    assert report.unmatched_spans == 0 and report.text_only == 0, report
    assert len(ts) == len(calls)
    by_id = {c.call_id: c for c in calls}
    for t in ts:
        assert t.token_source == "engine"
        call = by_id[t.call_id]
        assert list(t.prompt_ids) == list(call.prompt_ids) and list(t.response_ids) == list(call.response_ids)
        assert list(t.response_logprobs) == list(call.response_logprobs)
    assert sorted(t.call_id for t in ts) == sorted(by_id)
    merged_rows_check(stack, rollout, len(ts), by_id)
    return sorted(ts, key=lambda t: t.step), report


def merged_rows_check(stack, rollout, n_calls: int, by_id: dict):
    """With ``merge="prefix"``: every call is in one row, each merged call exactly where its ids put it.

    Prints how many of the agent's calls merged and why the others did not (issue 31's figures)."""
    rows, report = build_transitions(stack.store, [rollout], TransitionConfig(missing_reward=0.0, merge="prefix"))
    assert len(rows) + report.merged_calls == n_calls
    assert report.merged_calls + sum(report.merge_breaks.values()) == n_calls - 1
    for row in rows:
        for seg in row.segments or []:
            call = by_id[seg.call_id]
            assert list(row.response_ids[seg.start : seg.end]) == list(call.response_ids)
            assert list(row.prompt_ids) + list(row.response_ids[: seg.start]) == list(call.prompt_ids)
    print(
        f"\nmerge=prefix: {n_calls} calls -> {len(rows)} rows, {report.merged_calls} merged, "
        f"breaks {report.merge_breaks}"
    )


def tool_calls_in(call) -> list[dict]:
    """The tool calls a gateway record answered with (chat completions or Responses API)."""
    response = call.response or {}
    if "output" in response:
        return [item for item in response["output"] if item.get("type") == "function_call"]
    message = (response.get("choices") or [{}])[0].get("message") or {}
    return message.get("tool_calls") or []


def rendered_prompt(stack, call) -> str:
    return stack.tokenizer.decode(list(call.prompt_ids))


def test_langgraph_tool_calling_graph(stack):
    run = stack.run_agent("langgraph_weather.py", LANGCHAIN)
    rollout = finished(stack, run)
    out = run.output
    calls = engine_calls(stack, run, out["model_calls"])
    assert [c.call_id for c in calls] == out["response_ids"]
    assert {c.requested_model for c in calls} == {"gpt-4o-mini"}

    # The first call named the tool: the engine rendered it into the prompt and forced the call.
    first = calls[0]
    assert first.request["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "<tools>" in rendered_prompt(stack, first) and "get_weather" in rendered_prompt(stack, first)
    (call,) = tool_calls_in(first)
    assert call["function"]["name"] == "get_weather"
    assert out["tool_runs"] == [json.loads(call["function"]["arguments"])["city"]]
    # The tool's answer reached the model by the convention.
    assert "<tool_response>" in rendered_prompt(stack, calls[1])

    ts, report = transitions_of(stack, rollout, calls)
    assert report.joined_by_id == len(calls)
    assert [t.agent for t in ts] == ["assistant", "assistant"]
    tools = stack.store.query_spans(rollout_id=run.rollout_id, kind="tool")
    assert [s.name for s in tools] == ["get_weather"]


def test_langchain_create_agent_with_a_tool_that_calls_the_model(stack):
    run = stack.run_agent("langchain_research.py", LANGCHAIN)
    rollout = finished(stack, run)
    out = run.output
    assert len(out["tool_runs"]) >= 1, out  # the first turn required a tool
    calls = engine_calls(stack, run, out["model_calls"])
    assert sorted(c.call_id for c in calls) == sorted(out["response_ids"])
    assert calls[0].request["tool_choice"] == "required"
    assert tool_calls_in(calls[0])[0]["function"]["name"] == "summarize"
    by_model = {c.requested_model for c in calls}
    assert by_model == {"gpt-4o", "gpt-4.1-nano"}  # the agent's model and the tool's own

    ts, report = transitions_of(stack, rollout, calls)
    assert report.joined_by_id == len(calls)
    model_of = {c.call_id: c.requested_model for c in calls}
    # Every call runs inside the agent the script named (create_agent(name="researcher")): its loop in
    # the "model" node and the tool's own call in the "tools" node, both kept as agl.langgraph.node.
    assert [(t.agent, model_of[t.call_id]) for t in ts] == (
        [("researcher", "gpt-4o")] + [("researcher", "gpt-4.1-nano"), ("researcher", "gpt-4o")] * len(out["tool_runs"])
    )
    nodes = [
        s.attributes.get("agl.langgraph.node") for s in stack.store.query_spans(rollout_id=run.rollout_id, kind="llm")
    ]
    assert nodes == ["model"] + ["tools", "model"] * len(out["tool_runs"])


def test_autogen_assistant_with_a_tool_streaming(stack):
    run = stack.run_agent("autogen_weather.py", AUTOGEN)
    rollout = finished(stack, run)
    out = run.output
    assert out["stream_chunks"] >= 1
    calls = engine_calls(stack, run, out["model_calls"])
    for c in calls:
        assert c.endpoint == "chat.completions" and c.request["stream"] is True and c.requested_model == "gpt-4o"
    # AssistantAgent always asks with tool_choice "auto" (it cannot be set): the model may
    # answer directly; every call it made was run, and the tools were in the prompt.
    assert calls[0].request["tool_choice"] == "auto"
    assert "<tools>" in rendered_prompt(stack, calls[0])
    made = [tc for c in calls for tc in tool_calls_in(c)]
    assert len(out["tool_runs"]) == len(made)

    ts, report = transitions_of(stack, rollout, calls)
    # AutoGen's results carry no response id: the join is by order, confirmed by the messages.
    assert report.joined_by_order == len(calls)
    assert {t.agent for t in ts} == {"weather_agent"}


def test_openai_agents_sdk_handoff_on_the_responses_api(stack):
    run = stack.run_agent("agents_sdk_handoff.py", AGENTS_SDK)
    rollout = finished(stack, run)
    out = run.output
    assert out["last_agent"] == "Weather agent"
    assert len(out["tool_runs"]) == 1 and out["answer"] == f"It is sunny and 21 C in {out['tool_runs'][0]}."
    calls = engine_calls(stack, run, out["model_calls"])
    assert [c.call_id for c in calls] == out["response_ids"]
    for c in calls:  # the SDK's default path: /v1/responses, with its own default model name
        assert c.endpoint == "responses" and c.call_id.startswith("resp_") and "input" in c.request
        assert c.requested_model == c.request["model"]
    assert [tool_calls_in(c)[0]["name"] for c in calls] == ["transfer_to_weather_agent", "get_weather"]
    # The weather agent's request carries the handoff as Responses input items.
    kinds = [item.get("type") for item in calls[1].request["input"]]
    assert "function_call" in kinds and "function_call_output" in kinds

    ts, report = transitions_of(stack, rollout, calls)
    assert report.joined_by_id == len(calls)
    assert [t.agent for t in ts] == ["Triage agent", "Weather agent"]


def test_openai_agents_sdk_with_tracing_disabled(stack):
    run = stack.run_agent("agents_sdk_untraced.py", AGENTS_SDK)
    rollout = finished(stack, run)
    out = run.output
    assert len(out["tool_runs"]) >= 1, out  # tool_choice required
    calls = engine_calls(stack, run, out["model_calls"])
    assert [c.call_id for c in calls] == out["response_ids"]
    assert calls[0].request["tool_choice"] == "required"
    (call,) = tool_calls_in(calls[0])
    assert call["name"] == "add" and json.loads(call["arguments"]) == dict(zip("ab", out["tool_runs"][0], strict=False))
    # Tracing off: the SDK told agl nothing, the gateway records are all there is.
    assert list(stack.store.query_spans(rollout_id=run.rollout_id)) == []

    ts, report = transitions_of(stack, rollout, calls)
    assert report.gateway_only == len(calls)
    assert [t.agent for t in ts] == [None] * len(calls)


def test_langgraph_supervisor_calls_carry_the_workers_names(stack):
    run = stack.run_agent("supervisor_team.py", LANGCHAIN)
    rollout = finished(stack, run)
    assert run.output["nodes"][:2] == ["supervisor", "math_expert"]
    calls = sorted(stack.store.query_llm_calls(rollout_id=run.rollout_id), key=lambda c: c.seq)
    ts, report = transitions_of(stack, rollout, calls)
    assert report.joined_by_id == len(calls)
    agents = [t.agent for t in ts]
    # the supervisor hands off on every turn: its calls and the worker's alternate, under the user's names
    assert agents[:2] == ["supervisor", "math_expert"] and set(agents) == {"supervisor", "math_expert"}
    assert all(a != b for a, b in zip(agents, agents[1:], strict=False))
    # the inner node of create_react_agent ("agent") is kept beside the name
    nodes = {
        s.attributes.get("agl.langgraph.node") for s in stack.store.query_spans(rollout_id=run.rollout_id, kind="llm")
    }
    assert nodes == {"agent"}
    worker, _ = build_transitions(stack.store, [rollout], TransitionConfig(missing_reward=0.0, agents=["math_expert"]))
    assert len(worker) == agents.count("math_expert") >= 1
    assert {t.call_id for t in worker} == {t.call_id for t in ts if t.agent == "math_expert"}


def test_a_client_that_abandons_a_stream_frees_the_engine_and_the_call_is_left_out(stack):
    run = stack.run_agent("openai_abandoned_stream.py", {})
    rollout = finished(stack, run)
    # ~2000 tokens were asked for (eos ignored); the engine runs nothing a moment after the agent exited
    assert stack.engine.batchers[0].running_rows == 0
    calls = {c.call_id: c for c in stack.store.query_llm_calls(rollout_id=run.rollout_id)}
    abandoned, short = calls[run.output["abandoned_id"]], calls[run.output["short_id"]]
    assert abandoned.aborted and len(abandoned.response_ids) == 0 and abandoned.latency_s < 30
    assert not short.aborted and len(short.response_ids) > 0
    ts, report = build_transitions(stack.store, [rollout], TransitionConfig(missing_reward=0.0))
    assert [t.call_id for t in ts] == [short.call_id] and report.aborted_calls == 1
