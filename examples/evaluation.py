"""Running an example's agent on a split outside training, and its ``evaluate`` command.

:func:`run_agent` serves a model (the base, or the base with a LoRA adapter) behind the
agl gateway (:func:`agl_trainer.evaluation.evaluate`: the transformers engine unless the
caller brings another) and runs the agent on every task the way the trainer's
evaluation does: once and greedily by default, or ``samples`` times at a temperature, to
see how many items a GRPO group of that size would learn from (:mod:`examples.sampling`).

:func:`evaluate_main` is every example's ``evaluate`` command: the base model or a
trained adapter on a split, its summary printed and optionally written.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.sampling import add_sampling_arguments, check_sampling_arguments, evaluation_facts, sampled_tasks
from examples.spec import ExampleSpec


def run_agent(
    agent: Callable,
    summarize: Callable[..., dict[str, Any]],
    items: list[dict],
    *,
    model_path: str | Path,
    workdir: Path,
    adapter: str | Path | None = None,
    split: str = "test",
    concurrency: int = 16,
    timeout_s: float = 600.0,
    max_response_tokens: int | None = None,
    temperature: float = 0.0,
    samples: int = 1,
    resources: dict[str, Any] | None = None,
    engine: Any = None,
    **run: Any,
) -> dict[str, Any]:
    """Run ``agent`` ``samples`` times on each item at ``temperature``; ``summarize(rollouts, tasks, store)`` of them.

    ``engine`` serves ``model_path``; the caller that brings one starts and stops it. ``run`` goes
    to :func:`agl_trainer.evaluation.evaluate` (``mode``, ``seed``).
    Everything the run records (rollouts, spans, gateway calls) goes to a SQLite store in
    ``workdir``.
    """
    from agl.store.base import open_store
    from agl_trainer.evaluation import evaluate

    workdir.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{workdir.resolve() / 'agl.db'}")
    try:
        tasks = sampled_tasks(items, samples=samples, split=split)
        ended = evaluate(
            agent,
            tasks,
            store=store,
            model_path=model_path,
            adapter=adapter,
            engine=engine,
            resources=resources,
            concurrency=concurrency,
            timeout_s=timeout_s,
            max_response_tokens=max_response_tokens,
            temperature=temperature,
            **run,
        )
        return summarize(ended, {t.task_id: t.input for t in tasks}, store)
    finally:
        store.close()


def run_policies(workdir: Path) -> list[dict] | None:
    """The policies a training run in ``workdir`` named (its ``trainer_state.json``), or None when
    ``workdir`` is not a run's work directory or the run named none."""
    state = workdir / "trainer_state.json"
    if not state.is_file():
        return None
    return json.loads(state.read_text())["config"].get("policies") or None


def policy_adapters(workdir: Path, policies: list[dict]) -> dict[str, Path]:
    """Each trained policy's last published adapter in a run of ``policies`` (a frozen policy keeps its
    weights); a run of one policy published it as the run's default weights (``step-N``)."""
    from agl_verl.models import checkpoint_dir

    several = len(policies) > 1
    return {
        p["name"]: checkpoint_dir(workdir, policy=p["name"] if several else None)
        for p in policies
        if p.get("train", True)
    }


def evaluate_parser(spec: ExampleSpec, description: str | None) -> argparse.ArgumentParser:
    """The options of an example's ``evaluate`` command."""
    noun = spec.noun
    parser = argparse.ArgumentParser(
        prog=f"python -m {spec.package}.evaluate",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="LoRA adapter or training workdir (default: the base model); a run with a policy per role "
        "is served as it trained, each trained policy its last adapter",
    )
    parser.add_argument("--split", choices=["train", "val", "test"], default="test")
    parser.add_argument("--limit", type=int, help=f"only the first N {noun} of the split")
    spec.subset.add_to(parser, noun, training=False)
    add_sampling_arguments(parser)
    parser.add_argument(
        "--workdir", type=Path, help=f"where the evaluation's store goes (default: runs/{spec.runs}/eval-*)"
    )
    parser.add_argument("--out", type=Path, help="also write the summary here (JSON)")
    spec.options(parser)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--concurrency", type=int, default=16, help=f"{noun} at once")
    parser.add_argument("--max-response-tokens", type=int, default=spec.defaults["max_response_tokens"])
    return parser


def evaluate_main(spec: ExampleSpec, argv: list[str] | None = None, description: str | None = None) -> int:
    """Run the evaluation and print (and optionally write) its summary."""
    parser = evaluate_parser(spec, description)
    args = parser.parse_args(argv)
    check_sampling_arguments(parser, args)
    items = spec.load_split(args.split)
    values = getattr(args, spec.subset.option)
    if values:
        try:
            items = spec.subset.select(items, tuple(values))
        except ValueError as exc:
            parser.error(f"--{exc}")
    spec.prepare_or_exit(parser, args)

    import torch

    from agl.errors import ConfigError
    from agl_verl.models import checkpoint_dir, smollm2_dir

    torch.set_num_threads(args.threads)
    checkpoint = args.checkpoint.resolve() if args.checkpoint else None
    policies = run_policies(checkpoint) if checkpoint else None
    adapter: Path | dict[str, Path] | None = None
    try:
        if policies:
            adapter = policy_adapters(checkpoint, policies)
        elif checkpoint:
            adapter = checkpoint_dir(checkpoint)
    except ConfigError as exc:
        parser.error(str(exc))
    if isinstance(adapter, dict):
        label = f"{args.split}-{checkpoint.name}-" + "-".join(path.name for path in adapter.values())
    else:
        label = f"{args.split}-{adapter.parent.parent.parent.name + '-' + adapter.name if adapter else 'base'}"
    started = time.monotonic()
    summary = spec.run_split(
        items[: args.limit],
        model_path=smollm2_dir(),
        adapter=adapter,
        **({"policies": policies} if policies else {}),
        workdir=args.workdir or Path("runs") / spec.runs / f"eval-{label}",
        split=args.split,
        concurrency=args.concurrency,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
        samples=args.samples,
    )
    summary.update(evaluation_facts(args, checkpoint if policies else adapter, started), **{spec.subset.option: values})
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


def evaluate_command(spec: ExampleSpec, description: str | None) -> Callable[[list[str] | None], int]:
    """An example's ``evaluate`` command as a ``main(argv=None)`` function (``description``: its ``--help`` text)."""

    def main(argv: list[str] | None = None) -> int:
        """Run the evaluation and print (and optionally write) its summary."""
        return evaluate_main(spec, argv, description)

    return main
