"""The calculator agent end to end: real AutoGen objects, the real MCP calculator server, agl capture.

- The tool path: an ``AssistantAgent`` whose model answers are scripted with AutoGen's
  own ``ReplayChatCompletionClient`` calls the real ``mcp-server-calculator`` process
  through ``McpWorkbench``; a valid call is computed, and malformed ones (bad JSON, an
  unknown tool, a wrong argument type) come back to the agent as AutoGen's normal tool
  errors, so the episode continues to its answer.
- Through the gateway: the evaluation path (``run_split``) serves SmolLM2-135M-Instruct
  with the transformers engine behind the agl gateway and runs the agent on a problem;
  the spans carry the agent's name and join the gateway's records by response id.
- One training step with a tiny random model in place of SmolLM2 (the whole path in
  seconds, not learning).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import agl
from agl.capture import BufferedWriter, RolloutContext
from agl.store.sqlite import SqliteStore
from tests.examples.train_yaml import assert_yaml_is_the_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.fixture
def example():
    import examples.calc_agent.agent
    import examples.calc_agent.config
    import examples.calc_agent.evaluation
    import examples.calc_agent.problems
    import examples.calc_agent.prompts
    import examples.calc_agent.train

    return examples.calc_agent


def scripted(*answers):
    """AutoGen's replay client answering with ``answers`` (tool calls or text) in turn."""
    from autogen_core import FunctionCall
    from autogen_core.models import CreateResult, RequestUsage
    from autogen_ext.models.replay import ReplayChatCompletionClient

    results = []
    for answer in answers:
        if isinstance(answer, str):
            results.append(CreateResult(finish_reason="stop", content=answer, usage=RequestUsage(0, 0), cached=False))
        else:
            calls = [FunctionCall(id=f"call_{i}", name=name, arguments=args) for i, (name, args) in enumerate(answer)]
            results.append(
                CreateResult(finish_reason="function_calls", content=calls, usage=RequestUsage(0, 0), cached=False)
            )
    return ReplayChatCompletionClient(results)


async def test_malformed_tool_calls_reach_the_agent_as_tool_errors(example, sqlite_store):
    import agl_autogen

    errors_before = dict(agl_autogen.errors)
    writer = BufferedWriter(sqlite_store, interval_s=0.05)
    client = scripted(
        [
            ("calculate", '{"expression": "(4812 - 1397) + 23 * 144"}'),
            ("calculate", '{"expression": "1 +'),  # bad JSON
            ("square_root", '{"expression": "16"}'),  # an unknown tool
            ("calculate", '{"expression": 42}'),  # a number where the schema says string
        ],
    )
    with agl.use_rollout(RolloutContext(rollout_id="ro-calc", writer=writer)):
        output = await example.agent.solve(client, "A shop has 4812 apples. ...")
    writer.close()

    calls = output["tool_calls"]
    assert [c["name"] for c in calls] == ["calculate", "calculate", "square_root", "calculate"]
    assert [c["is_error"] for c in calls] == [False, True, True, True]
    assert calls[0]["result"] == "6727"  # computed by the MCP server process
    # one model call; the agent reports each call's result in the answer format, errors too
    assert output["answer"].startswith("ANSWER: 6727\nANSWER: Error") and output["answer"].count("ANSWER:") == 4
    assert example.prompts.parse_answer(output["answer"]) == 6727  # the errors state no number

    llm = list(sqlite_store.query_spans(rollout_id="ro-calc", kind="llm"))
    assert len(llm) == 1
    assert {s.attributes["gen_ai.agent.name"] for s in llm} == {"solver"}
    # the first call offered the MCP server's tool; its output carries the four calls
    first = json.dumps(llm[0].attributes)
    assert "calculate" in first and "square_root" in first and "(4812 - 1397) + 23 * 144" in first
    assert dict(agl_autogen.errors) == errors_before  # nothing failed inside the capture


async def test_the_calculator_server_evaluates_and_refuses(example):
    from autogen_ext.tools.mcp import McpWorkbench

    async with McpWorkbench(example.agent.calculator_server()) as calculator:
        (tool,) = await calculator.list_tools()
        assert tool["name"] == example.agent.TOOL_NAME
        assert tool["parameters"]["properties"]["expression"]["type"] == "string"
        result = await calculator.call_tool("calculate", {"expression": "((1178) / 19) * 15"})
        assert not result.is_error and float(result.result[0].content) == 930.0
        result = await calculator.call_tool("calculate", {"expression": "__import__('os')"})
        assert result.is_error


@pytest.mark.slow
def test_the_agent_through_the_gateway_and_the_engine(example, tmp_path):
    """SmolLM2 behind the real gateway: spans captured, joined by response id, tools offered."""
    from agl.store.base import open_store
    from agl_trainer.transitions import TransitionConfig, build_transitions
    from agl_verl.models import smollm2_dir

    items = example.problems.load_split("val")[:1]
    started = time.monotonic()
    summary = example.evaluation.run_split(
        items, model_path=smollm2_dir(), workdir=tmp_path, split="val", concurrency=1, max_response_tokens=24
    )
    assert time.monotonic() - started < 600
    assert summary["n"] == 1 and summary["statuses"] == {"succeeded": 1}
    assert summary["tool_offering_calls"] >= 1
    assert sum(summary["tool_call_kinds"].values()) == summary["tool_offering_calls"]

    store = open_store(f"sqlite:///{tmp_path / 'agl.db'}", create=False)
    try:
        (rollout,) = store.query_rollouts()
        llm = list(store.query_spans(rollout_ids=[rollout.rollout_id], kind="llm"))
        calls = list(store.query_llm_calls(rollout_ids=[rollout.rollout_id]))
        assert 1 <= len(llm) == len(calls) <= 1 + example.agent.MAX_TOOL_ITERATIONS
        assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["solver"] * len(llm)
        assert sorted(s.attributes["gen_ai.response.id"] for s in llm) == sorted(c.call_id for c in calls)
        first = min(calls, key=lambda c: c.created_at)
        # the MCP server's tool reached the engine, which rendered it into the prompt (SmolLM2 has no tool template)
        (tool,) = first.request["tools"]
        assert tool["function"]["name"] == "calculate"
        assert tool["function"]["parameters"]["properties"]["expression"]["type"] == "string"
        assert 0 < len(first.response_ids) <= 24 and len(first.prompt_ids) > 100
        transitions, report = build_transitions(store, [rollout], TransitionConfig(missing_reward=0.0))
        assert report.joined_by_id == len(calls)
        assert {t.token_source for t in transitions} == {"engine"}
        assert {t.agent for t in transitions} == {"solver"}
    finally:
        store.close()


def tiny_model(example, path: Path) -> Path:
    from agl_verl.models import build_tiny_model

    prompts = example.prompts
    corpus = [prompts.SYSTEM_MESSAGE, prompts.EXAMPLE_QUESTION, '<tool_call>{"name": "calculate"}</tool_call>']
    corpus += [t["input"]["question"] + " " + t["input"]["expression"] for t in example.problems.load_split("train")]
    return build_tiny_model(path, corpus, vocab_size=2048, max_position_embeddings=4096, seed=0)


@pytest.mark.slow
def test_one_training_step_end_to_end(example, tmp_path):
    model = tiny_model(example, tmp_path / "tiny")
    started = time.monotonic()
    argv = ["--seed", "0", "--steps", "1", "--batch-size", "2", "--n-rollouts", "2", "--eval-limit", "2"]
    argv += ["--model", str(model), "--max-response-tokens", "8", "--workdir", str(tmp_path / "run")]
    argv += ["--steps-without-signal", "skip", "--backend-setting", "entropy_coeff=0.001"]
    assert example.train.main([*argv, "--results", str(tmp_path / "results")]) == 0
    elapsed = time.monotonic() - started
    record = json.loads((tmp_path / "results" / "calc_agent-skip-steps1-entropy_coeff=0.001-seed0.json").read_text())
    assert record["steps_without_signal"] == "skip" and record["backend_settings"] == {"entropy_coeff": 0.001}
    (step,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open() if '"train"' in line]
    assert step["optimizer_step"] == (1.0 if step["transitions_with_signal"] else 0.0)
    assert record["train_signal_share"] == [round(step["transitions_with_signal"] / step["transitions"], 4)]

    assert (record["seed"], record["steps"], record["eval_problems"]) == (0, 1, 2)
    # the bound for one step end to end; about 9 s on 2 idle cores (2026-11-26)
    assert record["wall_s"] > 0 and elapsed < 90, elapsed
    for when in ("before", "after"):
        figures = record[when]
        assert figures["n"] == 2 and figures["statuses"] == {"succeeded": 2}
        assert figures["tool_offering_calls"] >= 2  # every episode's first call offers the calculator
        assert 0 <= figures["success"] <= 1
    assert record["train_rollouts"] == 4
    assert record["train_tool_calls"]["tool_offering_calls"] >= 4
    # every training call is the solver's and becomes a transition
    assert set(record["trained_transitions"]) == {"solver"}
    assert record["trained_transitions"]["solver"] >= 4
    assert record["step_s_mean"] is not None and record["step_s_mean"] > 0
    assert len(record["train_success_by_step"]) == 1 and 0 <= record["train_success_by_step"][0] <= 1
    assert (tmp_path / "run" / "verl" / "versions" / "step-1" / "adapter_config.json").is_file()


def test_train_yaml_is_the_run_train_py_makes(example):
    made = example.config.trainer_config(seed=0, workdir=Path("runs/calc-agent/yaml-seed0"), model_path="MODEL")
    assert_yaml_is_the_config(EXAMPLES / "calc_agent" / "train.yaml", made, "examples.calc_agent.rewards")


@pytest.mark.slow
def test_a_run_with_a_validation_curve_evaluates_val_every_n_steps_and_test_on_its_last_adapter(example, tmp_path):
    model = tiny_model(example, tmp_path / "tiny")
    argv = ["--seed", "0", "--steps", "2", "--batch-size", "2", "--n-rollouts", "2", "--eval-limit", "2"]
    argv += ["--model", str(model), "--max-response-tokens", "8", "--workdir", str(tmp_path / "run")]
    argv += ["--val-every", "1", "--val-limit", "3", "--results", str(tmp_path / "results")]
    argv += ["--curriculum", "2:3"]  # step 1 on two-operation problems, step 2 on three-operation ones
    assert example.train.main(argv) == 0
    record = json.loads((tmp_path / "results" / "calc_agent-ops3from2-steps2-seed0.json").read_text())
    assert record["curriculum"] == {"from_step": 2, "operations": [3]} and record["train_operations"] == [2]
    with SqliteStore(tmp_path / "run" / "agl.db") as store:
        operations = {t.task_id: t.input["operations"] for t in store.query_tasks()}
        trained = {
            s: {operations[r.task_id] for r in store.query_rollouts(step=s) if r.mode == "train"} for s in (1, 2)
        }
    assert trained == {1: {2}, 2: {3}}
    assert [point["step"] for point in record["val_curve"]] == [0, 1, 2]
    assert all(0 <= point["success_rate"] <= 1 for point in record["val_curve"])
    assert (record["val_every"], record["val_problems"], record["eval_problems"]) == (1, 3, 2)
    assert record["val_before"]["n"] == record["val_after"]["n"] == 3
    assert record["before"]["n"] == record["after"]["n"] == 2  # test: the model it started from, its last adapter
    assert (tmp_path / "run" / "test-after" / "agl.db").is_file()
    assert not Path(record["workdir"]).is_absolute() and (REPO / record["workdir"]).resolve() == tmp_path / "run"
    assert record["commit"] and len(record["commit"].removesuffix("-dirty")) == 40
