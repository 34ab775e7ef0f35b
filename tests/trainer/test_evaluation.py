"""agl_trainer.evaluation.evaluate: an agent run once per task through a real engine and gateway."""

from __future__ import annotations

import re

import openai
import pytest

from agl.schema import RolloutStatus, Task
from agl.store.sqlite import SqliteStore
from agl_trainer.evaluation import evaluate

CORPUS = ["Say a digit.", "0 1 2 3 4 5 6 7 8 9"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from agl_verl.models import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return build_tiny_model(root / "base", CORPUS, seed=1), build_tiny_model(root / "step-7", CORPUS, seed=2)


def digit_agent(task: dict, ctx) -> str:
    client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
    answer = client.chat.completions.create(
        model=ctx.model,
        messages=[{"role": "user", "content": f"Say a digit. {task['digits']}"}],
        temperature=ctx.resources["temperature"],
        max_tokens=3,
    )
    return answer.choices[0].message.content


def tasks() -> list[Task]:
    return [Task(task_id=f"t{i}", input={"digits": f"{i} {9 - i}"}) for i in range(6)]


def run(tmp_path, name: str, *, concurrency: int = 3, **kwargs) -> list:
    store = SqliteStore(tmp_path / f"{name}.db")
    try:
        ended = evaluate(digit_agent, tasks(), store=store, concurrency=concurrency, **kwargs)
        calls = {c.rollout_id: c for c in store.query_llm_calls(rollout_ids=[r.rollout_id for r in ended])}
    finally:
        store.close()
    return [(r, calls.get(r.rollout_id)) for r in ended]


def test_every_task_runs_once_greedily_with_its_calls_recorded(models, tmp_path):
    base, _ = models
    first = run(tmp_path, "first", model_path=base)
    assert [r.task_id for r, _ in first] == [t.task_id for t in tasks()]  # the tasks' order
    for rollout, call in first:
        assert rollout.status == RolloutStatus.SUCCEEDED and rollout.mode == "val"
        assert rollout.model_version == "base"
        assert call is not None and call.response_ids and call.prompt_ids  # the gateway recorded the tokens
    second = run(tmp_path, "second", model_path=base)
    assert [r.output for r, _ in second] == [r.output for r, _ in first]  # temperature 0: the same answers


def test_an_adapter_is_served_under_its_directory_name(models, tmp_path):
    base, trained = models
    # one task at a time: batched with others, a row's logprobs differ by float noise
    on_checkpoint = run(tmp_path, "ckpt", model_path=base, adapter=trained, concurrency=1)
    assert {r.model_version for r, _ in on_checkpoint} == {"step-7"}
    # the checkpoint's weights answered, not the base model's (random models may agree on the
    # greedy tokens, never on their logprobs)
    direct = run(tmp_path, "direct", model_path=trained, concurrency=1)
    assert [list(c.response_logprobs) for _, c in on_checkpoint] == [list(c.response_logprobs) for _, c in direct]
    on_base = run(tmp_path, "base", model_path=base, concurrency=1)
    assert [list(c.response_logprobs) for _, c in on_checkpoint] != [list(c.response_logprobs) for _, c in on_base]


WRITER, CHECKER = "writer-model", "checker-model"
POLICIES = [
    {"name": "writer", "models": [WRITER]},
    {"name": "checker", "models": [CHECKER], "train": False},
]


def two_role_agent(task: dict, ctx) -> str:
    """One call as each role, by the model name it asks for (as the SQL agent's writer and checker do)."""
    client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
    answers = [
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Say a digit. {task['digits']}"}],
            temperature=ctx.resources["temperature"],
            max_tokens=3,
        )
        for model in (WRITER, CHECKER)
    ]
    return " | ".join(a.choices[0].message.content for a in answers)


@pytest.fixture(scope="module")
def writer_adapter(models, tmp_path_factory):
    """A LoRA adapter on the base tiny model whose weights are not the identity (so it answers differently)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base, _ = models
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    folder = tmp_path_factory.mktemp("adapters") / "writer-step-30"
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(folder)
    return folder


def calls_by_model(tmp_path, name: str, **kwargs) -> dict[str, list]:
    """The recorded calls of an evaluation of ``two_role_agent``, one task at a time, by the model asked for."""
    store = SqliteStore(tmp_path / f"{name}.db")
    try:
        ended = evaluate(two_role_agent, tasks()[:3], store=store, concurrency=1, **kwargs)
        assert {r.status for r in ended} == {RolloutStatus.SUCCEEDED}
        calls = list(store.query_llm_calls(rollout_ids=[r.rollout_id for r in ended]))
    finally:
        store.close()
    order = {r.rollout_id: i for i, r in enumerate(ended)}
    calls.sort(key=lambda c: (order[c.rollout_id], c.seq))
    return {m: [c for c in calls if c.requested_model == m] for m in (WRITER, CHECKER)}


def logprobs(calls: list) -> list[float]:
    """The response tokens' log-probs of ``calls``, one after another."""
    return [lp for c in calls for lp in c.response_logprobs]


def test_a_run_of_policies_is_served_each_policy_its_own_weights(models, writer_adapter, tmp_path):
    base, _ = models
    per_role = calls_by_model(
        tmp_path, "per-role", model_path=base, policies=POLICIES, adapter={"writer": writer_adapter}
    )
    assert [(c.policy, c.model_version) for c in per_role[WRITER]] == [("writer", "writer-step-30")] * 3
    assert [(c.policy, c.model_version) for c in per_role[CHECKER]] == [("checker", "base")] * 3
    # the writer's calls were answered by the adapter, the checker's by the base model: compared with
    # runs that serve one set of weights to every call
    on_adapter = calls_by_model(tmp_path, "adapter", model_path=base, adapter=writer_adapter)
    on_base = calls_by_model(tmp_path, "base", model_path=base)
    assert logprobs(per_role[WRITER]) == pytest.approx(logprobs(on_adapter[WRITER]), abs=1e-4)
    assert logprobs(per_role[CHECKER]) == pytest.approx(logprobs(on_base[CHECKER]), abs=1e-4)
    assert logprobs(on_adapter[WRITER]) != pytest.approx(logprobs(on_base[WRITER]), abs=1e-4)


def test_a_run_of_policies_without_adapters_is_the_base_model_for_every_role(models, tmp_path):
    base, _ = models
    before = calls_by_model(tmp_path, "before", model_path=base, policies=POLICIES)
    assert {(c.policy, c.model_version) for c in before[WRITER]} == {("writer", "base")}
    on_base = calls_by_model(tmp_path, "base", model_path=base)
    assert logprobs(before[WRITER]) == pytest.approx(logprobs(on_base[WRITER]), abs=1e-4)


@pytest.mark.parametrize(
    ("adapter", "policies", "message"),
    [
        ({"writer": "w"}, None, "adapter: a mapping of policy to adapter needs the run's policies"),
        ("w", POLICIES, "adapter: with policies, a mapping of each trained policy's name"),
        ({"checker": "w"}, POLICIES, "adapter: 'checker' is no trained policy of the run (trained: writer)"),
        ({"rewriter": "w"}, POLICIES, "adapter: 'rewriter' is no trained policy"),
    ],
)
def test_adapters_that_do_not_fit_the_policies_are_refused_before_anything_starts(
    models, tmp_path, adapter, policies, message
):
    from agl.errors import ConfigError

    base, _ = models
    store = SqliteStore(tmp_path / "refused.db")
    try:
        with pytest.raises(ConfigError, match=re.escape(message)):
            evaluate(digit_agent, tasks(), store=store, model_path=base, adapter=adapter, policies=policies)
        assert list(store.query_rollouts()) == []  # refused before any task or rollout was added
    finally:
        store.close()
