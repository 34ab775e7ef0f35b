"""The local learner's learning-rate schedule against verl's: the same lr at every optimizer step as
verl's own schedule functions give, resumed bit-identically from a checkpoint, bad settings named, and
the same settings handed to verl's trainer in distributed mode (its engine builds the same schedule)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from agl.errors import ConfigError
from agl_trainer.backend import BackendContext
from agl_verl.backend import VerlBackend
from agl_verl.config import parse_settings
from agl_verl.schedule import build_lr_scheduler
from tests.verl.test_local_backend import digit_ids, make_backend, static_batch, tiny_model  # noqa: F401 (fixtures)

STEPS = 7
LR = 3e-3

SCHEDULES = {
    "constant-warmup": dict(lr_warmup_steps=3),
    "cosine": dict(lr_scheduler_type="cosine", lr_warmup_steps=2, min_lr_ratio=0.1),
    "cosine-ratio-1-indexed": dict(
        lr_scheduler_type="cosine", lr_warmup_steps_ratio=0.3, num_cycles=1.0, zero_indexed_step=False
    ),
}


def verl_lrs(schedule: dict, steps: int = STEPS) -> list[float]:
    """The lr of each training step from verl's own function, on an optimizer of its own, stepped as
    verl's worker steps it (once per training step)."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    warmup = schedule.get("lr_warmup_steps", -1)
    if warmup <= 0:
        warmup = int(schedule.get("lr_warmup_steps_ratio", 0.0) * steps)
    if schedule.get("lr_scheduler_type", "constant") == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    else:
        scheduler = get_cosine_schedule_with_warmup(
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=steps,
            min_lr_ratio=schedule.get("min_lr_ratio", 0.0),
            num_cycles=schedule.get("num_cycles", 0.5),
            zero_indexed_step=schedule.get("zero_indexed_step", True),
        )
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def rewarded(digit_ids, step: int, signal: bool = True):  # noqa: F811
    rng = random.Random(step)
    return [t.model_copy(update={"reward": rng.random() if signal else 1.0}) for t in static_batch(digit_ids)]


def lr_at_each_optimizer_step(backend: VerlBackend) -> list[float]:
    seen: list[float] = []
    backend.learner.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    return seen


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_lr_of_every_optimizer_step_is_verls(name, tiny_model, digit_ids, tmp_path):  # noqa: F811
    schedule = SCHEDULES[name]
    expected = verl_lrs(schedule)
    assert len(set(expected)) > 2  # a schedule that moves
    context = BackendContext(total_steps=STEPS)
    backend = make_backend(tiny_model, tmp_path, context=context, lr=LR, mini_batch_size=4, **schedule)
    seen = lr_at_each_optimizer_step(backend)
    reported = [backend.train_step(rewarded(digit_ids, step), step)["lr"] for step in range(1, STEPS + 1)]
    assert reported == expected
    # two mini-batches, two optimizer steps per training step, at the same lr: verl steps its schedule per training step
    assert seen == [lr for lr in expected for _ in range(2)]


def test_steps_the_learner_never_saw_and_steps_without_an_optimizer_step_count(tiny_model, digit_ids, tmp_path):  # noqa: F811
    schedule = SCHEDULES["cosine"]
    expected = verl_lrs(schedule)
    backend = make_backend(
        tiny_model,
        tmp_path,
        context=BackendContext(total_steps=STEPS),
        lr=LR,
        steps_without_signal="skip",
        **schedule,
    )
    seen = lr_at_each_optimizer_step(backend)
    lrs = {}
    for step in (1, 2, 4, 5, 7):  # the trainer calls no train_step for a step without transitions (3, 6)
        metrics = backend.train_step(rewarded(digit_ids, step, signal=step != 2), step)
        lrs[step] = metrics["lr"]
        assert metrics["optimizer_step"] == (0.0 if step == 2 else 1.0)
    assert lrs == {step: expected[step - 1] for step in lrs}
    assert seen == [expected[step - 1] for step in (1, 4, 5, 7)]


def test_default_settings_keep_a_constant_lr(tiny_model, digit_ids, tmp_path):  # noqa: F811
    backend = make_backend(tiny_model, tmp_path, lr=LR)
    lrs = [backend.train_step(rewarded(digit_ids, step), step)["lr"] for step in range(1, 4)]
    assert lrs == [LR, LR, LR]


@pytest.mark.parametrize("name", ["constant-warmup", "cosine"])
def test_a_resumed_run_continues_the_schedule_bit_identically(name, tiny_model, digit_ids, tmp_path):  # noqa: F811
    settings = dict(lr=LR, mini_batch_size=4, micro_batch_size=2, **SCHEDULES[name])
    context = BackendContext(total_steps=STEPS)
    straight = make_backend(tiny_model, tmp_path / "a", context=context, **settings)
    straight_lrs = [straight.train_step(rewarded(digit_ids, step), step)["lr"] for step in range(1, STEPS + 1)]

    first = make_backend(tiny_model, tmp_path / "b", context=context, **settings)
    lrs = [first.train_step(rewarded(digit_ids, step), step)["lr"] for step in range(1, 4)]
    first.save_checkpoint(tmp_path / "ckpt")
    torch.manual_seed(1234)  # a fresh process has other RNG state
    resumed = make_backend(tiny_model, tmp_path / "c", context=context, **settings)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.learner.lr_scheduler.state_dict() == first.learner.lr_scheduler.state_dict()
    assert resumed.learner.optimizer.param_groups[0]["lr"] == straight_lrs[3]
    lrs += [resumed.train_step(rewarded(digit_ids, step), step)["lr"] for step in range(4, STEPS + 1)]

    assert lrs == straight_lrs == verl_lrs(SCHEDULES[name])
    for (param, a), b in zip(
        straight.learner.model.named_parameters(), resumed.learner.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), param
    state = first.learner.state_dict()
    del state["lr_scheduler"]  # a checkpoint of a learner before schedules
    with pytest.raises(ValueError, match="checkpoint has no learning-rate schedule"):
        resumed.learner.load_state_dict(state)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(lr_scheduler_type="linear"), r"lr_scheduler_type: Input should be 'constant' or 'cosine'"),
        (dict(lr_warmup_steps="five"), r"lr_warmup_steps: Input should be a valid integer"),
        (dict(lr_warmup_steps_ratio=1.5), r"lr_warmup_steps_ratio: Input should be less than or equal to 1"),
        (dict(lr_scheduler_type="cosine", min_lr_ratio=-0.1), r"min_lr_ratio: Input should be greater than or equal"),
        (dict(lr_scheduler_type="cosine", num_cycles=-1), r"num_cycles: Input should be greater than or equal to 0"),
        (dict(min_lr_ratio=0.1), r"min_lr_ratio shapes the cosine schedule only; lr_scheduler_type is 'constant'"),
        (dict(num_cycles=1.0), r"num_cycles shapes the cosine schedule only"),
        (dict(zero_indexed_step=False), r"zero_indexed_step shapes the cosine schedule only"),
        (dict(lr_warmup_steps=5, lr_warmup_steps_ratio=0.1), r"lr_warmup_steps_ratio 0.1 is ignored when lr_warmup_st"),
    ],
)
def test_bad_schedule_settings_name_the_field(setting, message):
    with pytest.raises(ConfigError, match=message):
        VerlBackend(model_path="m", **setting)


@pytest.mark.parametrize(
    ("setting", "field"),
    [(dict(lr_scheduler_type="cosine"), "lr_scheduler_type 'cosine'"), (dict(lr_warmup_steps_ratio=0.1), "ratio")],
)
def test_a_schedule_over_the_runs_steps_is_refused_when_the_steps_are_not_known(setting, field, tiny_model, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match=f"{field}.* needs the run's total training steps"):
        make_backend(tiny_model, tmp_path, **setting)


# -- distributed mode: verl's own trainer ------------------------------------------------------------


def distributed(**schedule):
    from tests.verl.test_distributed import settings

    return settings(**schedule)


@pytest.mark.parametrize("name", SCHEDULES)
def test_distributed_mode_hands_verls_engine_the_same_schedule(name):
    """verl's FSDP engine builds its scheduler from the composed config (its ``_build_lr_scheduler``,
    called on a stand-in for the engine, which needs GPUs); it gives the local learner's lrs."""
    from verl.utils import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from agl_verl.distributed import compose_trainer_config

    schedule = SCHEDULES[name]
    optim = compose_trainer_config(distributed(**schedule)).actor_rollout_ref.actor.optim
    config = omega_conf_to_dataclass(optim)
    config.total_training_steps = STEPS  # as verl's RayPPOTrainer sets it from trainer.total_training_steps

    def lrs(build) -> list[float]:
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
        scheduler = build(optimizer)
        out = []
        for _ in range(STEPS):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    verls = lrs(lambda opt: FSDPEngine._build_lr_scheduler(SimpleNamespace(optimizer_config=config, rank=1), opt))
    local = parse_settings(dict(model_path="m", lr=LR, **schedule))
    assert verls == lrs(lambda opt: build_lr_scheduler(opt, local, STEPS)) == verl_lrs(schedule)


def test_distributed_defaults_are_verls_constant_lr():
    from agl_verl.distributed import compose_trainer_config

    optim = compose_trainer_config(distributed()).actor_rollout_ref.actor.optim
    assert (optim.lr_scheduler_type, optim.lr_warmup_steps, optim.lr_warmup_steps_ratio) == ("constant", -1, 0.0)
    assert (optim.min_lr_ratio, optim.num_cycles, optim.zero_indexed_step) == (0.0, 0.5, True)


def varied_agent(task_input, ctx):
    """One sampled call; reward by the answer's length, so groups of samples differ."""
    import httpx

    import agl

    with httpx.Client(base_url=ctx.base_url, headers={"Authorization": f"Bearer {ctx.api_key}"}, timeout=60) as http:
        body = {"model": ctx.model, "messages": [{"role": "user", "content": task_input["q"]}], "max_tokens": 6}
        r = http.post("/chat/completions", json={**body, "temperature": 1.0})
        r.raise_for_status()
    agl.emit_reward(len(r.json()["choices"][0]["message"]["content"]) / 40)


def test_a_trainer_run_tells_the_backend_its_steps_so_a_cosine_schedule_runs_over_them(tiny_model_dir, tmp_path):
    """Through the real trainer: the backend learns the run's step count (BackendContext.total_steps), and
    each step's recorded lr is verl's cosine schedule's over those steps."""
    import json

    from agl_trainer import Trainer
    from tests.verl.conftest import tiny_run_config

    steps, schedule = 3, {"lr_scheduler_type": "cosine", "min_lr_ratio": 0.1}
    backend = {"lr": LR, **schedule}
    config = tiny_run_config(
        tiny_model_dir, tmp_path, backend=backend, concurrency=4, steps=steps, batch_size=1, n_rollouts=4
    )
    Trainer(config).fit(varied_agent, [{"input": {"q": "Say a digit."}}])
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    lrs = [r["lr"] for r in records if r.get("kind") == "train"]
    assert lrs == verl_lrs(schedule, steps)
