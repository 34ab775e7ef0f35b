"""Replay a recorded step (:mod:`tests.benchmarks.step_fixtures`) through the engine and the learner.

:func:`replay_calls` sends a step's calls to an engine over HTTP, rollouts at once and each
rollout's calls in order; :func:`measure_engine`, :func:`measure_update` and
:func:`measure_step` time the parts :mod:`tests.benchmarks.bench_step` compares.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.benchmarks.step_fixtures import Call, StepFixture, completion_body, fixtures_of, load_fixture

COUNTER_KEYS = ("prompt_tokens", "prompt_tokens_computed", "prompt_tokens_cached", "generated_tokens")

RANDOM_MODELS = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32),
    "llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
}
"""Models ``--model`` builds from a transformers config with random weights (nothing can be
downloaded), on SmolLM2's tokenizer so the fixtures' token ids stay valid: timings only."""


@dataclass(frozen=True)
class Setup:
    """What the engine and the learner run: a model directory, a torch device and a dtype."""

    model_dir: Path
    device: str
    dtype: str
    label: str

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """``--device`` and ``--model``, the two choices :meth:`choose` takes."""
        parser.add_argument(
            "--device",
            choices=["auto", "cpu", "cuda"],
            default="auto",
            help="auto: the GPU in bfloat16 where torch sees one, else the CPU in float32",
        )
        parser.add_argument(
            "--model",
            choices=["smollm2", *RANDOM_MODELS],
            default="smollm2",
            help="SmolLM2-135M-Instruct, or a larger Llama built from a config with random weights (timings only)",
        )

    @classmethod
    def choose(cls, model: str, device: str) -> Setup:
        """``device`` "auto": the GPU in bfloat16 where torch sees one, else the CPU in float32."""
        import torch

        from agl_verl.models import smollm2_dir

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = "float32" if device == "cpu" else "bfloat16"
        model_dir = smollm2_dir() if model == "smollm2" else random_model_dir(model, smollm2_dir())
        name = "SmolLM2-135M-Instruct" if model == "smollm2" else f"{model} (random weights)"
        where = f"{device} ({torch.cuda.get_device_name()})" if device == "cuda" else device
        return cls(model_dir, device, dtype, f"{name}, {dtype} on {where}")


def random_model_dir(name: str, tokenizer_dir: Path) -> Path:
    """A Llama of ``RANDOM_MODELS[name]``'s shape with random weights and SmolLM2's tokenizer, saved once."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(tempfile.gettempdir()) / f"agl-bench-{name}"
    if (out / "config.json").exists():
        return out
    source = AutoConfig.from_pretrained(tokenizer_dir)
    shape = RANDOM_MODELS[name]
    config = LlamaConfig(
        vocab_size=source.vocab_size,
        num_key_value_heads=max(1, shape["num_attention_heads"] // 4),
        max_position_embeddings=source.max_position_embeddings,
        bos_token_id=source.bos_token_id,
        eos_token_id=source.eos_token_id,
        tie_word_embeddings=True,
        **shape,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


async def replay_calls(
    url: str, model: str, rollouts: list[list[Call]], concurrency: int
) -> list[list[tuple[int, int]]]:
    """Send every rollout's calls to ``url`` (``.../v1``): ``concurrency`` rollouts at a time, each
    rollout's calls one after the other. Returns, per rollout and call, the (prompt, generated)
    token counts the engine reports."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:

        async def one(rollout: list[Call]) -> list[tuple[int, int]]:
            async with gate:
                counts = []
                for call in rollout:
                    response = await client.post("/completions", json=completion_body(call, model))
                    response.raise_for_status()
                    choice = response.json()["choices"][0]
                    counts.append((len(choice["prompt_token_ids"]), len(choice["token_ids"])))
                return counts

        return list(await asyncio.gather(*(one(rollout) for rollout in rollouts)))


@contextmanager
def started_engine(setup: Setup | Path, cache_mb: float | None, seed: int = 0, **options: Any):
    """A started transformers engine, the examples' (``cache_mb`` None: the engine's default cache);
    ``setup`` a :class:`Setup` or a model directory on the CPU."""
    from agl_verl.engines.transformers_engine import TransformersEngine

    if isinstance(setup, Setup):
        setup, options = setup.model_dir, {"device": setup.device, "dtype": setup.dtype, **options}
    if cache_mb is not None:
        options["prefix_cache_mb"] = cache_mb
    engine = TransformersEngine(setup, seed=seed, **options)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@dataclass
class EngineRun:
    """One replay of a step's calls: its wall time, the counts the engine returned, its counters' change."""

    wall_s: float
    counts: list[list[tuple[int, int]]]
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def generated(self) -> int:
        """Tokens generated over every call."""
        return sum(g for rollout in self.counts for _, g in rollout)


def warm_up(engine: Any, fixture: StepFixture) -> None:
    """One short request first, the first prompt's last tokens reversed (so it shares no prefix
    with the step's prompts): the engine's one-time costs stay out of the timed replay."""
    first = fixture.calls[0]
    probe = Call(list(reversed(first.prompt_ids))[:16], [0], first.temperature, 1)
    asyncio.run(replay_calls(engine.urls[0], engine.served_model_name, [[probe]], 1))


def warm_up_gpu_engines(fixture: StepFixture, setup: Setup, arms: dict[str, float | None], concurrency: int) -> None:
    """On a GPU, the whole step replayed once untimed on each arm's engine: the first replays of a
    process pay for each new shape's kernels and memory blocks (measured on an H200: 15.6 and 9.6 s
    for the first two replays, 6.5 s later), which would land on whichever arm came first."""
    if setup.device == "cpu":
        return
    for cache_mb in arms.values():
        with started_engine(setup, cache_mb, fixture.settings["seed"]) as engine:
            measure_engine(engine, fixture, concurrency)


def measure_engine(engine: Any, fixture: StepFixture, concurrency: int) -> EngineRun:
    """Replay ``fixture``'s rollouts on a started ``engine``; wall time and counters of the replay alone."""
    warm_up(engine, fixture)
    before = engine.counters()
    started = time.perf_counter()
    counts = asyncio.run(replay_calls(engine.urls[0], engine.served_model_name, fixture.rollouts, concurrency))
    wall_s = time.perf_counter() - started
    after = engine.counters()
    return EngineRun(wall_s, counts, {k: after[k] - before.get(k, 0) for k in after})


def learner(fixture: StepFixture, setup: Setup, workdir: Path, engine: Any = None) -> Any:
    """The examples' verl learner (``examples/learner.py``) at the recorded run's settings, set up."""
    from agl_verl.backend import VerlBackend
    from examples.learner import backend_config

    settings = fixture.settings
    config = backend_config(
        model_path=setup.model_dir,
        lr=settings["lr"],
        seed=settings["seed"],
        workdir=workdir,
        temperature=settings["temperature"],
    )
    backend = VerlBackend(**config, device=setup.device, dtype=setup.dtype)
    backend.setup(engine)
    return backend


def timed_update(backend: Any, fixture: StepFixture) -> float:
    """Seconds of one ``train_step`` on the fixture's transitions."""
    transitions = fixture.build_transitions()
    started = time.perf_counter()
    backend.train_step(transitions, fixture.step)
    return time.perf_counter() - started


def warm_up_learner(fixture: StepFixture, setup: Setup) -> None:
    """One small update first (two of the step's transitions, one rewarded, so there is a gradient):
    the process's one-time costs of a learner stay out of the first timed update."""
    pair = [
        t.model_copy(update={"reward": float(k), "task_id": "warm-up"})
        for k, t in enumerate(fixture.build_transitions()[:2])
    ]
    with tempfile.TemporaryDirectory(prefix="agl-bench-step-") as tmp:
        backend = learner(fixture, setup, Path(tmp))
        try:
            backend.train_step(pair, 0)
        finally:
            backend.close()


def measure_update(fixture: StepFixture, setup: Setup) -> float:
    """The update alone: a fresh learner, no engine, one ``train_step``."""
    with tempfile.TemporaryDirectory(prefix="agl-bench-step-") as tmp:
        backend = learner(fixture, setup, Path(tmp))
        try:
            return timed_update(backend, fixture)
        finally:
            backend.close()


def measure_step(
    fixture: StepFixture, setup: Setup, cache_mb: float | None, concurrency: int
) -> tuple[EngineRun, float]:
    """The step as the synchronous trainer runs it, in one process: the engine started, the learner set
    up (the trainer's order), the rollouts replayed, then the update. Returns the replay and the
    step's seconds (replay + update)."""
    with (
        started_engine(setup, cache_mb, fixture.settings["seed"]) as engine,
        tempfile.TemporaryDirectory(prefix="agl-bench-step-") as tmp,
    ):
        backend = learner(fixture, setup, Path(tmp), engine)
        try:
            run = measure_engine(engine, fixture, concurrency)
            update_s = timed_update(backend, fixture)
        finally:
            backend.close()
    return run, run.wall_s + update_s


@dataclass
class Arm:
    """One engine setting's figures on one fixture."""

    name: str
    engine: EngineRun
    step: EngineRun | None = None
    step_s: float | None = None


def check_counts(fixture: StepFixture, run: EngineRun) -> None:
    """The replay did the fixture's work: every call, with its prompt and its response length."""
    expected = [[(len(c.prompt_ids), max(1, len(c.response_ids))) for c in rollout] for rollout in fixture.rollouts]
    if run.counts != expected:
        raise AssertionError(
            f"{fixture.agent} step {fixture.step}: the replay's token counts differ from the fixture's"
        )


def measure_fixture(
    fixture: StepFixture, setup: Setup, arms: dict[str, float | None], concurrency: int, step_arms: set[str]
) -> tuple[list[Arm], float]:
    """Every arm's engine alone, the update alone, then the step of each arm in ``step_arms`` (arms in
    the given order)."""
    results = []
    for name, cache_mb in arms.items():
        with started_engine(setup, cache_mb, fixture.settings["seed"]) as engine:
            run = measure_engine(engine, fixture, concurrency)
        check_counts(fixture, run)
        results.append(Arm(name, run))
    update_s = measure_update(fixture, setup)
    for arm, cache_mb in zip(results, arms.values(), strict=True):
        if arm.name in step_arms:
            arm.step, arm.step_s = measure_step(fixture, setup, cache_mb, concurrency)
    return results, update_s


def report(fixture: StepFixture, arms: list[Arm], update_s: float) -> list[str]:
    """The fixture's table: one row an arm, then the recorded step against the baseline's floor."""
    total = fixture.prompt_tokens()
    base = arms[-1].engine.counters.get("prompt_tokens_computed", total)
    lines = [
        f"{fixture.agent} step {fixture.step}: {len(fixture.rollouts)} rollouts, {len(fixture.calls)} calls, "
        f"{total} prompt tokens, {fixture.response_tokens()} generated, {len(fixture.transitions)} transitions",
        f"  {'engine':<13}{'computed':>9}{'cached':>8}{'% base':>8}{'gen tok/s':>10}{'engine s':>9}"
        f"{'update s':>9}{'step s':>8}{'floor s':>8}{'step/floor':>11}",
    ]
    for arm in arms:
        computed = arm.engine.counters.get("prompt_tokens_computed")
        cached = arm.engine.counters.get("prompt_tokens_cached")
        share = f"{100 * computed / base:.0f}%" if computed is not None and base else "n/a"
        floor = arm.engine.wall_s + update_s
        lines.append(
            f"  {arm.name:<13}{'n/a' if computed is None else computed:>9}{'n/a' if cached is None else cached:>8}"
            f"{share:>8}{arm.engine.generated / arm.engine.wall_s:>10.1f}{arm.engine.wall_s:>9.1f}{update_s:>9.1f}"
            + (
                f"{arm.step_s:>8.1f}{floor:>8.1f}{arm.step_s / floor:>10.2f}x"
                if arm.step_s
                else f"{'-':>8}{floor:>8.1f}"
            )
        )
    measured = fixture.measured
    if "time_step_s" in measured:
        floor = arms[-1].engine.wall_s + update_s
        lines.append(
            f"  recorded run: step {measured['time_step_s']:.1f} s "
            f"(rollouts {measured.get('time_rollout_s', 0):.1f} s, update {measured.get('time_update_s', 0):.1f} s)"
            f" = {measured['time_step_s'] / floor:.2f}x "
            f"the {arms[-1].name} floor (the run's step includes the agents, the gateway and publishing)"
        )
    return lines


def replay_all(args: argparse.Namespace) -> int:
    """Measure every chosen fixture and print its table."""
    import os

    import torch

    import agl_verl.engines

    torch.set_num_threads(args.threads)
    paths = [p for p in fixtures_of(args.agent) if not args.step or load_fixture(p).step in args.step]
    if not paths:
        print(f"no fixtures for {args.agent or 'any agent'}: record some with --record AGENT")
        return 2
    cache_mb = agl_verl.engines.DEFAULT_PREFIX_CACHE_MB if args.cache_mb is None else args.cache_mb
    arms = {f"cache {cache_mb:g}MB": cache_mb, "baseline": 0}
    setup = Setup.choose(args.model, args.device)
    print(
        f"{setup.label}, {torch.get_num_threads()} torch threads; engine arms: {', '.join(arms)}; "
        f"load average {os.getloadavg()[0]:.2f} at start",
        flush=True,
    )
    for k, path in enumerate(paths):
        fixture = load_fixture(path)
        order = dict(list(arms.items())[:: -1 if k % 2 else 1])  # alternate, so drift hits both arms alike
        step_arms = set(arms) - ({"baseline"} if args.no_baseline_step else set())
        concurrency = args.concurrency or fixture.settings["concurrency"]
        if k == 0:
            warm_up_learner(fixture, setup)
            warm_up_gpu_engines(fixture, setup, order, concurrency)
        results, update_s = measure_fixture(fixture, setup, order, concurrency, step_arms)
        results.sort(key=lambda arm: arm.name == "baseline")
        print("\n".join(report(fixture, results, update_s)), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0
