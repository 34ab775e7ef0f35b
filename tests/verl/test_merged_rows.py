"""Merged rows (``transitions.merge="prefix"``) in the learners: loss on generated tokens only,
each call's own advantage, and the same gradient as the same calls unmerged.

The model is the tiny llama of :mod:`tests.verl.test_local_backend`, trained by the real local
learner (verl's estimators and losses); the merged rows come from the builder's own merge.
"""

from __future__ import annotations

import random

import pytest
import torch

from agl.schema import Transition
from agl_trainer.transitions.config import BuildReport
from agl_trainer.transitions.merge import merge_prefix
from agl_verl.dataproto import generated_mask, transitions_to_dataproto
from agl_verl.models import build_tiny_model
from agl_verl.segments import per_call_advantages
from tests.verl.test_local_backend import DIGITS, make_backend


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The tiny llama of test_local_backend (the same corpus and size)."""
    corpus = [" ".join(random.Random(i).choices(DIGITS, k=8)) for i in range(50)]
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), corpus, vocab_size=40, hidden_size=64, layers=2, seed=0)


@pytest.fixture(scope="module")
def digit_ids(tiny_model) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    return [tok.convert_tokens_to_ids(d) for d in DIGITS]


def tool_loops(digit_ids, *, tasks=3, rollouts=3, turns=3, rewards=None, logprobs=True) -> list[Transition]:
    """Per-call transitions of ``tasks`` × ``rollouts`` tool loops of ``turns`` calls each: every
    prompt is the previous prompt, its response and a tool result of random length.

    ``rewards(task, rollout, turn)`` gives each call's reward (default: one per rollout)."""
    rng = random.Random(3)
    reward_of = rewards or (lambda task, rollout, turn: float((task + rollout) % 3))
    out = []
    for task in range(tasks):
        system = rng.choices(digit_ids, k=5)
        for r in range(rollouts):
            prompt = system + rng.choices(digit_ids, k=2 + r)
            for turn in range(turns):
                response = rng.choices(digit_ids, k=rng.randint(1, 4))
                out.append(
                    Transition(
                        rollout_id=f"t{task}-r{r}",
                        task_id=f"t{task}",
                        step=turn,
                        agent="solver",
                        prompt_ids=prompt,
                        response_ids=response,
                        response_logprobs=[-rng.uniform(1.5, 3.0) for _ in response] if logprobs else None,
                        reward=reward_of(task, r, turn),
                        call_id=f"t{task}-r{r}-c{turn}",
                        weight=1 / turns,
                    )
                )
                prompt = prompt + response + rng.choices(digit_ids, k=rng.randint(1, 3))
    return out


def merged(calls: list[Transition]) -> list[Transition]:
    """The calls merged rollout by rollout, as the builder merges them."""
    report = BuildReport()
    out = []
    for rid in dict.fromkeys(t.rollout_id for t in calls):
        out.extend(merge_prefix([t for t in calls if t.rollout_id == rid], report))
    assert report.merged_calls == len(calls) - len(out) and report.merge_breaks == {}
    return out


def gradients(backend) -> list[torch.Tensor]:
    """The gradient of the last optimizer step (left on the parameters until the next step zeroes it)."""
    return [p.grad.detach().clone() for p in backend.learner.trainable]


@pytest.mark.parametrize(
    "rewards",
    [None, lambda task, rollout, turn: float((task * 7 + rollout * 3 + turn) % 4)],
    ids=["one-reward-per-rollout", "a-reward-per-call"],
)
@pytest.mark.parametrize("logprobs", [True, False], ids=["engine-logprobs", "recomputed"])
def test_a_merged_batch_gives_the_same_gradient_as_its_calls_unmerged(
    tiny_model, digit_ids, tmp_path, rewards, logprobs
):
    calls = tool_loops(digit_ids, rewards=rewards, logprobs=logprobs)
    rows = merged(calls)
    assert len(rows) == 9 and all(len(t.segments) == 3 for t in rows)
    runs = {}
    for name, batch in (("calls", calls), ("rows", rows)):
        # grad_clip off: the gradients compared are the loss's own
        backend = make_backend(tiny_model, tmp_path / name, micro_batch_size=4, grad_clip=None)
        metrics = backend.train_step(batch, step=0)
        runs[name] = metrics, gradients(backend)
    (per_call, call_grads), (per_row, row_grads) = runs["calls"], runs["rows"]
    assert per_row["tokens"] < per_call["tokens"]  # the shared prefixes are run once
    assert per_row["advantages/mean"] == pytest.approx(per_call["advantages/mean"], abs=1e-6)
    assert per_row["advantages/std"] == pytest.approx(per_call["advantages/std"], rel=1e-5)
    assert per_row["pg_loss"] == pytest.approx(per_call["pg_loss"], rel=1e-4, abs=1e-6)
    assert per_row["grad_norm"] == pytest.approx(per_call["grad_norm"], rel=1e-4)
    assert per_call["grad_norm"] > 0
    for a, b in zip(row_grads, call_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_merged_rows_mask_the_context_and_spread_each_calls_advantage(digit_ids):
    per_turn = lambda task, rollout, turn: float(turn + rollout)  # noqa: E731
    calls = tool_loops(digit_ids, tasks=2, rollouts=2, rewards=per_turn)
    rows = merged(calls)
    data = transitions_to_dataproto(rows)
    unmerged = transitions_to_dataproto(calls)
    assert data.meta_info["merged"] == 4 and "segment_of" not in unmerged.batch
    compute = _grpo
    data = per_call_advantages(data, compute)
    unmerged = per_call_advantages(unmerged, compute)
    by_call = {t.call_id: i for i, t in enumerate(calls)}
    for i, row in enumerate(rows):
        mask = data.batch["response_mask"][i]
        n = len(row.response_ids)
        assert mask[:n].tolist() == generated_mask(row) and mask[n:].sum() == 0
        # the attention mask still covers the context: the model reads the tool results
        assert data.batch["attention_mask"][i, -data.batch["responses"].shape[1] :][:n].sum() == n
        assert data.batch["advantages"][i][mask == 0].abs().sum() == 0
        for seg in row.segments:
            j = by_call[seg.call_id]
            width = seg.end - seg.start
            torch.testing.assert_close(
                data.batch["advantages"][i, seg.start : seg.end], unmerged.batch["advantages"][j, :width]
            )
            assert data.batch["token_level_rewards"][i, seg.end - 1] == calls[j].reward
            lp = data.batch["rollout_log_probs"][i, seg.start : seg.end]
            torch.testing.assert_close(lp, torch.tensor(list(calls[j].response_logprobs)))
    # distinct advantages within one row: each segment has its own
    assert len(set(data.batch["advantages"][0][data.batch["response_mask"][0].bool()].tolist())) > 1


def test_a_cut_merged_row_keeps_the_segments_before_the_cut(digit_ids):
    (row, *_) = merged(tool_loops(digit_ids, tasks=1, rollouts=1))
    second = row.segments[1]
    data = transitions_to_dataproto([row], max_response_length=second.start + 1)
    assert data.meta_info["truncated"] == 1
    assert data.batch["response_mask"][0].tolist() == generated_mask(row)[: second.start + 1]
    assert int(data.batch["segment_of"][0].max()) == 1  # the third segment is wholly past the cut
    assert data.batch["token_level_rewards"][0, second.start] == row.segments[1].reward


def test_distributed_outputs_mask_the_context(digit_ids):
    from agl_verl.distributed import transitions_to_outputs

    (row, *_) = merged(tool_loops(digit_ids, tasks=1, rollouts=1))
    (out,) = transitions_to_outputs([row])
    assert out.response_ids == list(row.response_ids) and out.response_mask == generated_mask(row)
    assert 0 in out.response_mask and len(out.response_logprobs) == len(out.response_ids)
    (cut,) = transitions_to_outputs([row], response_length=4)
    assert cut.response_mask == generated_mask(row)[:4]


def _grpo(data):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    return compute_advantage(data, adv_estimator="grpo", num_repeat=1)
