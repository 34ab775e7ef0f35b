"""The local verl backend: config errors, metrics, text transitions, publish, LoRA, resume, learning."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agl.errors import AglError, ConfigError
from agl.schema import ModelVersion, Transition
from agl_trainer.backend import STANDALONE, BackendContext
from agl_trainer.engine import Engine
from agl_verl.backend import VerlBackend
from agl_verl.dataproto import TextTransitionError
from agl_verl.models import build_tiny_model

DIGITS = [str(d) for d in range(10)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    corpus = [" ".join(random.Random(i).choices(DIGITS, k=8)) for i in range(50)]
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), corpus, vocab_size=40, hidden_size=64, layers=2, seed=0)


@pytest.fixture(scope="module")
def digit_ids(tiny_model) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = [tok.convert_tokens_to_ids(d) for d in DIGITS]
    assert len(set(ids)) == 10 and tok.unk_token_id not in ids
    return ids


class RecordingEngine(Engine):
    """Stands in for an inference engine at the seam: records the versions it is told to serve."""

    def __init__(self):
        self.loaded: list[ModelVersion] = []

    def start(self) -> list[str]:
        return []

    def load_version(self, version: ModelVersion) -> None:
        self.loaded.append(version)

    @property
    def model_version(self) -> str | None:
        return self.loaded[-1].version if self.loaded else None


def make_backend(model_path, tmp_path, context: BackendContext = STANDALONE, **overrides) -> VerlBackend:
    config = dict(model_path=str(model_path), lr=3e-3, micro_batch_size=32, seed=0, workdir=str(tmp_path / "work"))
    config.update(overrides)
    backend = VerlBackend(**config)
    backend.setup(None, context)
    return backend


@torch.no_grad()
def sample(model, prompts: list[list[int]], n: int, max_new: int, gen: torch.Generator):
    """Sample ``n`` responses per prompt from the model itself, with their logprobs (the engine's job)."""
    ids = torch.tensor([p for p in prompts for _ in range(n)])
    responses, logprobs = [], []
    for _ in range(max_new):
        logits = model(input_ids=ids).logits[:, -1, :].float()
        logp = torch.log_softmax(logits, dim=-1)
        token = torch.multinomial(logp.exp(), 1, generator=gen)
        responses.append(token)
        logprobs.append(logp.gather(1, token))
        ids = torch.cat([ids, token], dim=1)
    return torch.cat(responses, 1).tolist(), torch.cat(logprobs, 1).tolist()


@torch.no_grad()
def greedy_accuracy(model, prompts: list[list[int]]) -> float:
    logits = model(input_ids=torch.tensor(prompts)).logits[:, -1, :]
    answers = logits.argmax(-1).tolist()
    return sum(a == p[0] for a, p in zip(answers, prompts, strict=False)) / len(prompts)


def first_digit_transitions(model, digit_ids, rng, gen, tasks=8, n=8, step=0):
    """A GRPO batch for "answer with the prompt's first digit", sampled from the current policy."""
    prompts = [rng.choices(digit_ids, k=4) for _ in range(tasks)]
    responses, logprobs = sample(model, prompts, n, 1, gen)
    out = []
    for i, (resp, lp) in enumerate(zip(responses, logprobs, strict=False)):
        prompt = prompts[i // n]
        out.append(
            Transition(
                rollout_id=f"s{step}-r{i}",
                task_id=f"s{step}-t{i // n}",
                step=0,
                prompt_ids=prompt,
                response_ids=resp,
                response_logprobs=lp,
                reward=float(resp[0] == prompt[0]),
            )
        )
    return out


def static_batch(digit_ids, with_logprobs=True):
    rng = random.Random(1)
    out = []
    for i in range(8):
        prompt = rng.choices(digit_ids, k=4)
        resp = rng.choices(digit_ids, k=2)
        out.append(
            Transition(
                rollout_id=f"r{i}",
                task_id=f"t{i // 4}",
                step=0,
                prompt_ids=prompt,
                response_ids=resp,
                response_logprobs=[-2.3, -2.3] if with_logprobs else None,
                reward=float(i % 2),
            )
        )
    return out


# -- config ------------------------------------------------------------------------------------------


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"adv_estimator: unknown advantage estimator 'grpoo'; known: .*rloo"):
        VerlBackend(model_path="m", adv_estimator="grpoo")
    with pytest.raises(ConfigError, match=r"adv_estimator: 'gae' needs a critic"):
        VerlBackend(model_path="m", adv_estimator="gae")
    with pytest.raises(ConfigError, match=r"policy_loss: unknown policy loss 'ppo'; known: .*vanilla"):
        VerlBackend(model_path="m", policy_loss="ppo")
    with pytest.raises(ConfigError, match=r"kl_penalty: unknown KL estimator"):
        VerlBackend(model_path="m", kl_penalty="kl2")
    with pytest.raises(ConfigError, match=r"learning_rate: unknown setting"):
        VerlBackend(model_path="m", learning_rate=1e-5)
    with pytest.raises(ConfigError, match=r"lr: Input should be greater than 0"):
        VerlBackend(model_path="m", lr=0)
    with pytest.raises(ConfigError, match=r"model_path is required"):
        VerlBackend()
    with pytest.raises(ConfigError, match=r"lora.r: "):
        VerlBackend(model_path="m", lora={"r": 0})


def test_a_trainer_refuses_agents_told_another_temperature_than_the_backends(tiny_model, tmp_path):
    """The PPO ratio is only right when the rollouts were sampled at the backend's temperature."""
    from agl_trainer import Trainer

    config = {
        "workdir": str(tmp_path / "run"),
        "store": f"sqlite:///{tmp_path / 'agl.db'}",
        "backend": {"name": "verl", "config": {"model_path": str(tiny_model)}},  # temperature 1, the default
        "rollout": {"resources": {"temperature": 0.5}},
        "progress": False,
    }
    with pytest.raises(ConfigError, match=r"rollout.resources.temperature: 0.5 .* the backend's 1\b"):
        Trainer(config).fit(lambda task_input, ctx: None, [{"input": {}}])
    assert VerlBackend(model_path="m", temperature=0.5).sampling_temperature == 0.5


def test_use_before_setup_is_a_clear_error(tiny_model, digit_ids):
    backend = VerlBackend(model_path=str(tiny_model))
    with pytest.raises(AglError, match="call setup"):
        backend.train_step(static_batch(digit_ids), 0)


# -- one step ----------------------------------------------------------------------------------------


def test_train_step_metrics_and_weights_change(tiny_model, digit_ids, tmp_path):
    backend = make_backend(tiny_model, tmp_path)
    before = [p.detach().clone() for p in backend.learner.model.parameters()]
    metrics = backend.train_step(static_batch(digit_ids), step=0)
    for key in (
        "loss",
        "pg_loss",
        "pg_clipfrac",
        "ppo_kl",
        "kl",
        "entropy",
        "grad_norm",
        "response_length/mean",
        "tokens_per_s",
        "advantages/mean",
        "advantages/std",
        "transitions",
        "skipped_text",
    ):
        assert key in metrics, key
        assert metrics[key] == metrics[key], key  # not NaN
    assert metrics["transitions"] == 8 and metrics["response_length/mean"] == 2.0
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0 and metrics["tokens_per_s"] > 0
    after = list(backend.learner.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=False))


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg"])
def test_other_estimators_run(tiny_model, digit_ids, tmp_path, estimator):
    backend = make_backend(tiny_model, tmp_path, adv_estimator=estimator)
    metrics = backend.train_step(static_batch(digit_ids), step=0)
    assert metrics["grad_norm"] > 0


def test_zero_weights_give_zero_gradient(tiny_model, digit_ids, tmp_path):
    backend = make_backend(tiny_model, tmp_path)
    batch = [t.model_copy(update={"weight": 0.0}) for t in static_batch(digit_ids)]
    assert backend.train_step(batch, step=0)["grad_norm"] == 0.0
    half = [t.model_copy(update={"weight": 0.5}) for t in static_batch(digit_ids)]
    full = make_backend(tiny_model, tmp_path).train_step(static_batch(digit_ids), step=0)["grad_norm"]
    assert make_backend(tiny_model, tmp_path).train_step(half, step=0)["grad_norm"] == pytest.approx(full / 2, rel=1e-4)


def grouped_batch(digit_ids, group_rewards: list[list[float]]) -> list[Transition]:
    """One GRPO group per entry of ``group_rewards``, random prompts and responses."""
    rng = random.Random(2)
    out = []
    for g, rewards in enumerate(group_rewards):
        prompt = rng.choices(digit_ids, k=4)
        for i, reward in enumerate(rewards):
            out.append(
                Transition(
                    rollout_id=f"g{g}-r{i}",
                    task_id=f"t{g}",
                    step=0,
                    prompt_ids=prompt,
                    response_ids=rng.choices(digit_ids, k=1 + i % 3),
                    response_logprobs=None,  # old log-probs are recomputed: a forward pass of their own
                    reward=reward,
                )
            )
    return out


def test_groups_without_signal_get_no_forward_pass_and_the_same_update(tiny_model, digit_ids, tmp_path, monkeypatch):
    """A group whose rewards are all equal has advantage 0 everywhere: skipping its forward pass
    changes nothing in the weights (it still counts in the token-mean normalization)."""
    import agl_verl.local

    batch = grouped_batch(digit_ids, [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 1, 0]])

    def train(skip: bool) -> tuple[dict, list[torch.Tensor], int]:
        if not skip:
            monkeypatch.setattr(agl_verl.local, "ZERO_FREE_LOSSES", frozenset())
        # old log-probs in a pass of their own, which skips the same transitions
        backend = make_backend(tiny_model, tmp_path / str(skip), old_log_probs="recompute")
        rows = []
        hook = backend.learner.model.register_forward_hook(
            lambda m, args, kw, out: rows.append(len(kw["input_ids"])), with_kwargs=True
        )
        metrics = backend.train_step(batch, step=0)
        hook.remove()
        monkeypatch.undo()
        return metrics, [p.detach().clone() for p in backend.learner.model.parameters()], sum(rows)

    skipped, skipped_weights, skipped_rows = train(skip=True)
    full, full_weights, full_rows = train(skip=False)
    assert skipped["transitions_with_signal"] == 8 and full["transitions_with_signal"] == 16
    # rows in the old-log-prob pass plus rows in the training pass
    assert (skipped_rows, full_rows) == (8 + 8, 16 + 16)
    assert skipped["loss"] == pytest.approx(full["loss"], abs=1e-6)
    assert skipped["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
    for a, b in zip(skipped_weights, full_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_batch_without_signal_still_steps_the_optimizer(tiny_model, digit_ids, tmp_path):
    """All groups uniform: no forward pass at all, and AdamW still steps on zero gradients
    (its moments decay, as they would have with the forward passes)."""
    backend = make_backend(tiny_model, tmp_path)
    backend.train_step(static_batch(digit_ids), step=0)
    before = [p.detach().clone() for p in backend.learner.trainable]
    metrics = backend.train_step(grouped_batch(digit_ids, [[1, 1, 1, 1], [0, 0, 0, 0]]), step=1)
    assert metrics["transitions_with_signal"] == 0 and metrics["grad_norm"] == 0.0
    assert metrics["tokens_per_s"] == 0.0 and metrics["tokens"] > 0  # no token got a forward pass
    moved = [not torch.equal(a, b) for a, b in zip(before, backend.learner.trainable, strict=True)]
    assert any(moved)  # Adam's first moment from step 0 still moves the weights


def test_a_batch_without_signal_can_skip_the_optimizer_step(tiny_model, digit_ids, tmp_path):
    """With ``steps_without_signal="skip"`` the same signal-less batch moves nothing: no weight, no moment."""
    backend = make_backend(tiny_model, tmp_path, steps_without_signal="skip")
    first = backend.train_step(static_batch(digit_ids), step=0)
    assert first["optimizer_step"] == 1.0
    weights = [p.detach().clone() for p in backend.learner.trainable]
    moments = [backend.learner.optimizer.state[p]["exp_avg"].clone() for p in backend.learner.trainable]
    metrics = backend.train_step(grouped_batch(digit_ids, [[1, 1, 1, 1], [0, 0, 0, 0]]), step=1)
    assert metrics["transitions_with_signal"] == 0 and metrics["optimizer_step"] == 0.0
    for p, w, m in zip(backend.learner.trainable, weights, moments, strict=True):
        assert torch.equal(p, w) and torch.equal(backend.learner.optimizer.state[p]["exp_avg"], m)
    # a batch with signal steps as before
    assert backend.train_step(static_batch(digit_ids), step=2)["optimizer_step"] == 1.0
    with pytest.raises(ConfigError, match="steps_without_signal 'skip' is the local learner's"):
        VerlBackend(model_path="m", mode="distributed", steps_without_signal="skip")


def ragged_batch(digit_ids) -> list[Transition]:
    """Transitions of unlike lengths (prompts of 2 to 24 tokens, responses of 1 to 12), two per task."""
    rng = random.Random(3)
    lengths = [(2, 1), (24, 12), (3, 2), (20, 3), (5, 11), (4, 1), (16, 6), (2, 2)]
    return [
        Transition(
            rollout_id=f"r{i}",
            task_id=f"t{i // 2}",
            step=0,
            prompt_ids=rng.choices(digit_ids, k=p_len),
            response_ids=rng.choices(digit_ids, k=r_len),
            response_logprobs=[-2.3] * r_len,
            reward=float(i % 2),
        )
        for i, (p_len, r_len) in enumerate(lengths)
    ]


def test_micro_batches_see_only_the_columns_their_rows_use(tiny_model, digit_ids, tmp_path):
    """Rows are micro-batched by length and each micro-batch is cut to its own rows' span: every
    row's log-probs are those of the row alone, unpadded, and short rows cost short forward passes,
    whose LM head runs over the response positions alone."""
    from agl_verl.dataproto import transitions_to_dataproto
    from tests.verl.conftest import reference_logprobs

    batch = ragged_batch(digit_ids)
    backend = make_backend(tiny_model, tmp_path, micro_batch_size=2)
    learner = backend.learner
    data = transitions_to_dataproto(batch, pad_token_id=learner.pad_token_id)
    widths, logit_rows = [], []

    def seen(module, args, kwargs, out):
        widths.append(kwargs["input_ids"].shape[1])
        logit_rows.append(out.logits.shape[1])

    hook = learner.model.register_forward_hook(seen, with_kwargs=True)
    got = learner.log_probs(data)
    hook.remove()
    assert got.shape == data.batch["responses"].shape
    full = data.batch["input_ids"].shape[1]
    # by total length: (2+1, 2+2), (3+2, 4+1), (5+11, 16+6), (20+3, 24+12); each cut to its
    # longest prompt and longest response, with logits for the response alone (and the prompt's last)
    assert full == 24 + 12 and widths == [2 + 2, 4 + 2, 16 + 11, 24 + 12]
    assert learner.keeps_logits and logit_rows == [2 + 1, 2 + 1, 11 + 1, 12 + 1]
    learner.model.eval()
    for row, t in enumerate(batch):
        expected = torch.tensor(reference_logprobs(learner.model, t.prompt_ids, t.response_ids))
        n = len(t.response_ids)
        torch.testing.assert_close(got[row, :n], expected, rtol=1e-4, atol=1e-5)


def test_the_update_is_the_same_in_one_micro_batch_or_many(tiny_model, digit_ids, tmp_path):
    """Gradients accumulated over length-sorted, trimmed micro-batches equal the whole batch's."""
    batch = ragged_batch(digit_ids)
    runs = {}
    for micro in (2, 32):
        backend = make_backend(tiny_model, tmp_path / str(micro), micro_batch_size=micro)
        metrics = backend.train_step(batch, step=0)
        runs[micro] = metrics, [p.detach().clone() for p in backend.learner.trainable]
    (small, small_weights), (whole, whole_weights) = runs[2], runs[32]
    assert small["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert small["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    # AdamW's first step is about lr (3e-3) in size wherever the gradient is not 0, float noise
    # in a tiny gradient included: agreement to a hundredth of a step
    for a, b in zip(small_weights, whole_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=3e-5)


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}])
def test_gradient_checkpointing_recomputes_each_layer_for_the_same_update(tiny_model, digit_ids, tmp_path, lora):
    """With checkpointing each decoder layer runs twice per micro-batch (forward, then again in the
    backward) and the weights come out as without it."""
    batch = ragged_batch(digit_ids)
    runs = {}
    for checkpointing in (False, True):
        work = tmp_path / str(checkpointing)
        backend = make_backend(tiny_model, work, micro_batch_size=4, lora=lora, gradient_checkpointing=checkpointing)
        layer = next(m for m in backend.learner.model.modules() if type(m).__name__.endswith("DecoderLayer"))
        calls: list[None] = []
        # a pre-hook: the backward's recomputation stops once it has what it needs, before a forward hook
        layer.register_forward_pre_hook(lambda *_, calls=calls: calls.append(None))
        metrics = backend.train_step(batch, step=0)
        runs[checkpointing] = metrics, calls, [p.detach().clone() for p in backend.learner.trainable]
    (plain, plain_calls, plain_weights), (checkpointed, checkpointed_calls, checkpointed_weights) = runs.values()
    micro_batches = -(-len(batch) // 4)
    assert len(plain_calls) == micro_batches
    assert len(checkpointed_calls) == 2 * micro_batches
    assert checkpointed["loss"] == plain["loss"] and checkpointed["grad_norm"] == plain["grad_norm"]
    for a, b in zip(plain_weights, checkpointed_weights, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="gradient_checkpointing is the local learner's"):
        VerlBackend(model_path="m", mode="distributed", gradient_checkpointing=True)


def test_recompute_old_log_probs_without_engine_logprobs(tiny_model, digit_ids, tmp_path):
    backend = make_backend(tiny_model, tmp_path)
    metrics = backend.train_step(static_batch(digit_ids, with_logprobs=False), step=0)
    # old == current policy before the update: ratio is exactly 1, nothing is clipped
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["pg_clipfrac"] == 0.0
    backend = make_backend(tiny_model, tmp_path, old_log_probs="recompute")
    metrics = backend.train_step(static_batch(digit_ids), step=0)
    assert metrics["engine_logprob_diff"] > 0  # the hand-written -2.3s are not the model's


def test_at_a_temperature_other_than_1_old_log_probs_are_recomputed_at_it(tiny_model, digit_ids, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    # sampled at temperature 1 from the model itself, with the raw-logit logprobs an engine records
    sampled = first_digit_transitions(model, digit_ids, random.Random(0), torch.Generator().manual_seed(0))
    batch = [t.model_copy(update={"reward": float(i % 2)}) for i, t in enumerate(sampled)]  # every group has signal

    at_one = make_backend(tiny_model, tmp_path).train_step(batch, step=0)
    assert at_one["ppo_kl"] == pytest.approx(0.0, abs=1e-5)  # the engine's logprobs are the policy's at 1
    # at 0.5 they are not (the policy's are log-softmax(logits / 0.5)): taken as old log-probs, the
    # first update's ratio would be off 1 and clip; recomputed at 0.5 it is exactly 1
    cold = make_backend(tiny_model, tmp_path / "cold", temperature=0.5).train_step(batch, step=0)
    assert cold["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and cold["pg_clipfrac"] == 0.0
    with pytest.raises(ConfigError, match=r"old_log_probs 'engine' needs temperature 1, not 0.5"):
        VerlBackend(model_path="m", temperature=0.5, old_log_probs="engine")


def counted_update(backend: VerlBackend, batch: list[Transition]) -> dict:
    """One train step, with the rows of every forward pass of the policy (a forward hook) and the
    old and current log-probs of the response tokens in every policy-loss call (verl's loss
    function, called through)."""
    learner = backend.learner
    rows: list[int] = []
    losses: list[tuple[torch.Tensor, torch.Tensor]] = []
    real_loss = learner.policy_loss_fn

    def recording_loss(*, old_log_prob, log_prob, response_mask, **kwargs):
        # where the mask is 0 (padding) the values are whatever the pass left there: set to 0
        kept = response_mask.bool()
        losses.append((old_log_prob.where(kept, 0.0), log_prob.detach().where(kept, 0.0)))
        return real_loss(old_log_prob=old_log_prob, log_prob=log_prob, response_mask=response_mask, **kwargs)

    learner.policy_loss_fn = recording_loss
    hook = learner.model.register_forward_hook(
        lambda m, a, kw, out: rows.append(len(kw["input_ids"])), with_kwargs=True
    )
    metrics = backend.train_step(batch, step=0)
    hook.remove()
    learner.policy_loss_fn = real_loss
    weights = [p.detach().clone() for p in learner.trainable]
    return {"metrics": metrics, "rows": rows, "losses": losses, "weights": weights}


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}])
def test_one_mini_batch_takes_old_log_probs_from_its_loss_forward_pass(tiny_model, digit_ids, tmp_path, lora):
    """At temperature 0.5 with one mini-batch and one epoch, old log-probs are the loss forward
    pass's own, detached: one forward pass per micro-batch instead of two, and the update a
    separate pass (``old_log_probs="recompute"``) gives, up to float noise."""
    batch = ragged_batch(digit_ids)
    settings = dict(temperature=0.5, micro_batch_size=4, lora=lora, gradient_checkpointing=lora is not None)
    runs = {
        mode: counted_update(make_backend(tiny_model, tmp_path / mode, old_log_probs=mode, **settings), batch)
        for mode in ("auto", "recompute")
    }
    folded, separate = runs["auto"], runs["recompute"]
    assert folded["rows"] == [4, 4] and separate["rows"] == [4, 4, 4, 4]  # (old pass,) then loss pass
    for old, current in folded["losses"]:
        assert torch.equal(old, current)  # the ratio is exactly 1
    for (folded_old, _), (separate_old, _) in zip(folded["losses"], separate["losses"], strict=True):
        torch.testing.assert_close(folded_old, separate_old, rtol=1e-5, atol=1e-6)
    assert folded["metrics"]["ppo_kl"] == 0.0 and folded["metrics"]["pg_clipfrac"] == 0.0
    assert folded["metrics"]["loss"] == pytest.approx(separate["metrics"]["loss"], rel=1e-5)
    assert folded["metrics"]["grad_norm"] == pytest.approx(separate["metrics"]["grad_norm"], rel=1e-4)
    for a, b in zip(folded["weights"], separate["weights"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=3e-5)  # a hundredth of AdamW's first step (lr 3e-3)


def test_later_mini_batches_keep_the_rollouts_old_log_probs(tiny_model, digit_ids, tmp_path):
    """Two mini-batches: the first folds, the second's old log-probs come from a pass before the
    first optimizer step (the rollout's policy), not from its own forward pass after it. With two
    epochs every row is seen after a step, so every row gets that pass, as with "recompute"."""
    batch = ragged_batch(digit_ids)
    settings = dict(temperature=0.5, micro_batch_size=4, mini_batch_size=4)
    folded = counted_update(make_backend(tiny_model, tmp_path / "auto", **settings), batch)
    separate = counted_update(make_backend(tiny_model, tmp_path / "sep", old_log_probs="recompute", **settings), batch)
    assert folded["rows"] == [4, 4, 4] and separate["rows"] == [4, 4, 4, 4]
    (first_old, first_current), (second_old, second_current) = folded["losses"]
    assert torch.equal(first_old, first_current)
    torch.testing.assert_close(second_old, separate["losses"][1][0], rtol=1e-5, atol=1e-6)
    assert (second_old - second_current).abs().max() > 1e-3  # the first step moved the policy
    assert folded["metrics"]["loss"] == pytest.approx(separate["metrics"]["loss"], rel=1e-5)
    # two AdamW steps of about lr (3e-3) each where the gradient is not 0: agreement to a tenth of one
    for a, b in zip(folded["weights"], separate["weights"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=3e-4)

    two_epochs = dict(settings, ppo_epochs=2)
    folded = counted_update(make_backend(tiny_model, tmp_path / "auto2", **two_epochs), batch)
    separate = counted_update(
        make_backend(tiny_model, tmp_path / "sep2", old_log_probs="recompute", **two_epochs), batch
    )
    assert folded["rows"] == separate["rows"] == [4, 4] + [4] * 4
    for a, b in zip(folded["weights"], separate["weights"], strict=True):
        assert torch.equal(a, b)


def test_text_transitions_skipped_and_counted_or_rejected(tiny_model, digit_ids, tmp_path):
    text = Transition(
        rollout_id="x", task_id="t0", step=0, prompt_ids=[], response_ids=[], reward=1.0, token_source="text"
    )
    backend = make_backend(tiny_model, tmp_path)
    metrics = backend.train_step([*static_batch(digit_ids), text], step=0)
    assert metrics["skipped_text"] == 1 and metrics["transitions"] == 8
    only_text = backend.train_step([text], step=1)
    assert only_text == {"transitions": 0.0, "skipped_text": 1.0, "skipped_empty": 0.0}
    strict = make_backend(tiny_model, tmp_path, text_transitions="error")
    with pytest.raises(TextTransitionError, match="token_source='text'"):
        strict.train_step([*static_batch(digit_ids), text], step=0)


def test_kl_against_frozen_reference(tiny_model, digit_ids, tmp_path):
    backend = make_backend(tiny_model, tmp_path, kl_coef=0.1, kl_penalty="low_var_kl", lr=1e-2)
    first = backend.train_step(static_batch(digit_ids), step=0)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any update
    second = backend.train_step(static_batch(digit_ids), step=1)
    assert second["kl"] > 1e-6
    ref = backend.learner.reference
    assert all(not p.requires_grad for p in ref.parameters())


# -- publish, LoRA, checkpoint ----------------------------------------------------------------------


def test_publish_saves_loadable_weights_and_tells_the_engine(tiny_model, digit_ids, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = RecordingEngine()
    backend = make_backend(tiny_model, tmp_path)
    backend.setup(engine)
    backend.train_step(static_batch(digit_ids), step=3)
    version = backend.publish(3)
    assert version.version == "step-3" and version.step == 3
    assert Path(version.path) == (tmp_path / "work" / "versions" / "step-3").resolve()
    assert engine.loaded == [version] and engine.model_version == "step-3"
    loaded = AutoModelForCausalLM.from_pretrained(version.path)
    AutoTokenizer.from_pretrained(version.path)
    trained = backend.learner.model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, trained[name]), name


def test_lora_trains_adapter_only_and_publishes_it(tiny_model, digit_ids, tmp_path):
    engine = RecordingEngine()
    backend = make_backend(
        tiny_model, tmp_path, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}, kl_coef=0.05
    )
    backend.setup(engine)
    model = backend.learner.model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    backend.train_step(static_batch(digit_ids), step=0)
    metrics = backend.train_step(static_batch(digit_ids), step=1)
    assert metrics["kl"] > 0  # the reference is the base model with the adapter switched off
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    version = backend.publish(1)
    assert (Path(version.path) / "adapter_config.json").exists()
    assert version.metadata["adapter"] is True and version.base_model == str(tiny_model)
    assert engine.loaded[-1] is version


@pytest.mark.slow
def test_checkpoint_resume_continues_identically(tiny_model, digit_ids, tmp_path):
    def batches():
        rng = random.Random(5)
        for _step in range(4):
            yield [t.model_copy(update={"reward": rng.random()}) for t in static_batch(digit_ids)]

    settings = dict(mini_batch_size=4, micro_batch_size=2, ppo_epochs=2)
    straight = make_backend(tiny_model, tmp_path / "a", **settings)
    for step, batch in enumerate(batches()):
        straight.train_step(batch, step)

    first = make_backend(tiny_model, tmp_path / "b", **settings)
    resumed = make_backend(tiny_model, tmp_path / "c", **settings)
    for step, batch in enumerate(batches()):
        if step < 2:
            first.train_step(batch, step)
        if step == 2:
            first.save_checkpoint(tmp_path / "ckpt")
            torch.manual_seed(1234)  # a fresh process has other RNG state
            resumed.load_checkpoint(tmp_path / "ckpt")
        if step >= 2:
            resumed.train_step(batch, step)
    for (name, a), b in zip(
        straight.learner.model.named_parameters(), resumed.learner.model.parameters(), strict=False
    ):
        assert torch.equal(a, b), name
    with pytest.raises(FileNotFoundError, match="no verl backend checkpoint"):
        resumed.load_checkpoint(tmp_path / "nothing")


# -- learning ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_learns_first_digit_from_its_own_samples(tiny_model, digit_ids, tmp_path):
    """GRPO + PPO clip on samples of the model itself: greedy accuracy rises far beyond chance."""
    backend = make_backend(tiny_model, tmp_path, lr=1e-3, micro_batch_size=64, seed=1)
    model = backend.learner.model
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    held_out = [random.Random(99 + i).choices(digit_ids, k=4) for i in range(100)]
    before = greedy_accuracy(model, held_out)
    rewards = []
    for step in range(100):
        batch = first_digit_transitions(model, digit_ids, rng, gen, step=step)
        rewards.append(sum(t.reward for t in batch) / len(batch))
        backend.train_step(batch, step)
    after = greedy_accuracy(model, held_out)
    early, late = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"greedy accuracy {before:.2f} -> {after:.2f}; sampled reward {early:.2f} -> {late:.2f}")
    assert after >= before + 0.25, (before, after)
    assert late >= early + 0.1, (early, late)  # 640 samples per window: ~0.016 std
