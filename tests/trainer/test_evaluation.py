"""agl_trainer.evaluation.evaluate: an agent run once per task through a real engine and gateway."""

from __future__ import annotations

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
