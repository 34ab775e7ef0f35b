"""The SQL agent example end to end: train.py runs one training step and writes its results file.

A tiny random model (built here, with a tokenizer trained on the agent's prompts)
stands in for SmolLM2 so the step takes seconds: what is checked is the whole path,
not learning. The LangGraph agent's three LLM nodes call the gateway, their spans
carry the node names as agent names, the reward plugin scores the rollouts, only the
writer's and the rewriter's calls become training transitions (the checker keeps the
base policy), the backend updates the LoRA adapter, and the results file holds the
figures report.py needs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.examples.train_yaml import assert_yaml_is_the_config

EXAMPLES = Path(__file__).parents[2] / "examples"
pytestmark = pytest.mark.slow


@pytest.fixture
def example():
    import examples.sql_agent.config
    import examples.sql_agent.prompts
    import examples.sql_agent.questions
    import examples.sql_agent.train

    return examples.sql_agent


def tiny_model(example, path: Path) -> Path:
    from agl_verl.models import build_tiny_model

    prompts = example.prompts
    corpus = [prompts.WRITER_SYSTEM, prompts.CHECKER_SYSTEM, prompts.EXAMPLE_ANSWER, prompts.REWRITE_USER]
    corpus += [t["input"]["question"] + " " + t["input"]["gold_sql"] for t in example.questions.load_split("train")]
    return build_tiny_model(path, corpus, vocab_size=2048, max_position_embeddings=2048, seed=0)


def test_one_training_step_end_to_end(example, tmp_path):
    model = tiny_model(example, tmp_path / "tiny")
    started = time.monotonic()
    argv = ["--seed", "0", "--steps", "1", "--batch-size", "2", "--n-rollouts", "2", "--eval-limit", "2"]
    argv += ["--model", str(model), "--max-response-tokens", "8", "--workdir", str(tmp_path / "run")]
    assert example.train.main([*argv, "--results", str(tmp_path / "results")]) == 0
    elapsed = time.monotonic() - started
    record = json.loads((tmp_path / "results" / "main-steps1-seed0.json").read_text())

    assert (record["arm"], record["seed"], record["steps"], record["eval_questions"]) == ("main-steps1", 0, 1, 2)
    assert record["wall_s"] > 0 and elapsed < 90, elapsed
    for when in ("before", "after"):
        figures = record[when]
        assert figures["n"] == 2 and set(figures["success_by_tier"]) == {"easy", "medium", "hard"}
        assert 0 <= figures["success"] <= 1
        # greedy evaluation: every question was written once and checked at least once
        assert figures["agent_calls"]["write_query"] == 2
        assert figures["agent_calls"]["check_query"] >= 2
        # the checker measured on each of its calls: a random model's verdict is never "YES"
        checker = figures["checker"]
        assert checker["checks"] + checker["unread"] == figures["agent_calls"]["check_query"]
        assert checker["checks"] >= 2 and checker["acceptance"] == 0.0 and checker["acceptance_of_wrong"] == 0.0
    calls = record["train_agent_calls"]
    assert set(calls) <= {"write_query", "check_query", "rewrite_query"}
    assert calls["write_query"] == 4 and calls["check_query"] >= 4
    # a random model's verdict is never "YES": every rollout goes the full three checks and two rewrites
    assert calls["check_query"] == 3 * 4 and calls["rewrite_query"] == 2 * 4
    # the checker keeps the base policy: only the writer's and the rewriter's calls are trained
    assert record["trained_transitions"] == {"rewrite_query": 8, "write_query": 4}
    assert (tmp_path / "run" / "verl" / "versions" / "step-1" / "adapter_config.json").is_file()
    # --refresh rebuilds the same figures from the run's store, without training
    refresh = ["--seed", "0", "--steps", "1", "--eval-limit", "2", "--results", str(tmp_path / "results"), "--refresh"]
    assert example.train.main(refresh) == 0
    assert json.loads((tmp_path / "results" / "main-steps1-seed0.json").read_text()) == record

    # evaluate.py's path: the trained adapter on the engine, the agent under a runner with rollout keys
    from examples.sql_agent import evaluation

    items = example.questions.load_split("test")[:2]
    summary = evaluation.run_split(
        items,
        model_path=model,
        adapter=tmp_path / "run" / "verl" / "versions" / "step-1",
        workdir=tmp_path / "eval",
        max_response_tokens=8,
    )
    assert summary["n"] == 2 and summary["statuses"] == {"succeeded": 2}
    assert summary["agent_calls"]["write_query"] == 2


def test_the_per_role_arm_trains_the_writer_and_serves_the_checker_the_base_model(example, tmp_path):
    """Two policies on one engine: the writer's calls train its adapter, the checker's stay on the base."""
    from agl.store.sqlite import SqliteStore

    model = tiny_model(example, tmp_path / "tiny")
    argv = ["--seed", "0", "--steps", "2", "--batch-size", "1", "--n-rollouts", "2", "--eval-limit", "1"]
    argv += ["--model", str(model), "--max-response-tokens", "8", "--workdir", str(tmp_path / "run")]
    assert example.train.main([*argv, "--arm", "per-role", "--results", str(tmp_path / "results")]) == 0
    record = json.loads((tmp_path / "results" / "per-role-steps2-seed0.json").read_text())
    assert [p["name"] for p in record["policies"]] == ["writer", "checker"]
    assert record["trained_transitions"] == {"rewrite_query": 2 * 2 * 2, "write_query": 2 * 2}

    store = SqliteStore(tmp_path / "run" / "agl.db")
    try:
        steps = {r.rollout_id: (r.mode, r.step) for r in store.query_rollouts()}
        seen = {(c.requested_model, c.policy, c.model_version, steps[c.rollout_id]) for c in store.query_llm_calls()}
    finally:
        store.close()
    writer, checker = example.agent.WRITER_MODEL, example.agent.CHECKER_MODEL
    assert seen == {
        (writer, "writer", "base", ("val", 0)),  # the test split before training
        (checker, "checker", "base", ("val", 0)),
        (writer, "writer", "base", ("train", 1)),
        (checker, "checker", "base", ("train", 1)),
        (writer, "writer", "writer-step-1", ("train", 2)),
        (checker, "checker", "base", ("train", 2)),  # frozen: the base model whatever the writer learned
        (writer, "writer", "writer-step-2", ("val", 3)),
        (checker, "checker", "base", ("val", 3)),
    }
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "train"]
    shares = [round(s["policy/writer/transitions_with_signal"] / s["transitions"], 4) for s in steps]
    assert json.loads((tmp_path / "results" / "per-role-steps2-seed0.json").read_text())["train_signal_share"] == shares
    record = steps[-1]
    assert record["policy/writer/transitions"] == 2 + 4 and record["policy/checker/calls"] == 6
    versions = tmp_path / "run" / "verl" / "versions"
    assert sorted(p.name for p in versions.iterdir()) == ["writer-step-1", "writer-step-2"]


def test_the_per_role_arm_with_a_validation_curve_evaluates_test_a_policy_per_role(example, tmp_path):
    """With --val-every, test is evaluated after training outside the trainer: the writer on its last
    adapter, the checker on the base model, as the run trained them (not one adapter for every role)."""
    from agl.store.sqlite import SqliteStore

    model = tiny_model(example, tmp_path / "tiny")
    argv = ["--seed", "0", "--steps", "1", "--batch-size", "1", "--n-rollouts", "2", "--eval-limit", "1"]
    argv += ["--val-every", "1", "--val-limit", "1", "--model", str(model), "--max-response-tokens", "8"]
    argv += ["--arm", "per-role", "--workdir", str(tmp_path / "run"), "--results", str(tmp_path / "results")]
    assert example.train.main(argv) == 0
    record = json.loads((tmp_path / "results" / "per-role-steps1-seed0.json").read_text())
    assert [point["step"] for point in record["val_curve"]] == [0, 1]
    assert record["after"]["n"] == 1 and record["before"]["n"] == 1

    writer, checker = example.agent.WRITER_MODEL, example.agent.CHECKER_MODEL
    for when, writer_version in (("test-before", "base"), ("test-after", "writer-step-1")):
        store = SqliteStore(tmp_path / "run" / when / "agl.db")
        try:
            seen = {(c.requested_model, c.policy, c.model_version) for c in store.query_llm_calls()}
        finally:
            store.close()
        assert seen == {(writer, "writer", writer_version), (checker, "checker", "base")}, when


def test_train_yaml_is_the_main_arm_train_py_makes(example):
    workdir = Path("runs/sql-agent/yaml-main-seed0")
    made = example.config.trainer_config("main", seed=0, workdir=workdir, model_path="MODEL")
    assert_yaml_is_the_config(EXAMPLES / "sql_agent" / "train.yaml", made, "examples.sql_agent.rewards")
    # and the tasks it names are the ones train.py trains on
    easy = example.questions.of_tiers(example.questions.load_split("train"), example.config.TRAIN_TIERS)
    assert example.questions.load_split("train-easy") == easy
