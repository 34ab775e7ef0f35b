"""One training seed of an example: its command line, the run, and its results file.

SmolLM2-135M-Instruct with a LoRA adapter, the transformers engine behind the agl
gateway, verl's GRPO advantages and PPO loss in the local backend, all in this process.
The test split is evaluated greedily after the last step; the base model's figures are
evaluated once and shared by every seed (``results/base/test.json``, :mod:`examples.baseline`).
Nothing is evaluated, selected or tuned on test in between (``val_every: 0``). The
figures go to ``results/<arm>-seed<N>.json``, which the example's ``report.py`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.baseline import BASE_FILE, add_before_argument, shared_before
from examples.loggers import add_logger_argument, with_loggers
from examples.run_clock import RunClock
from examples.spec import ExampleSpec

REPO = Path(__file__).resolve().parent.parent


def train_parser(spec: ExampleSpec, description: str | None) -> argparse.ArgumentParser:
    """The options of an example's ``train`` command."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {spec.package}.train",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=spec.defaults["steps"])
    parser.add_argument("--batch-size", type=int, default=spec.defaults["batch_size"], help="tasks per step")
    parser.add_argument(
        "--n-rollouts", type=int, default=spec.defaults["n_rollouts"], help="rollouts per task (the GRPO group)"
    )
    spec.subset.add_to(parser, spec.noun, training=True)
    spec.train_options(parser)
    parser.add_argument("--workdir", type=Path, help=f"default: runs/{spec.runs}/<arm>-seed<N>")
    here = Path(__file__).resolve().parent / spec.name
    parser.add_argument("--results", type=Path, default=here / "results", help="where <arm>-seed<N>.json goes")
    spec.options(parser)
    parser.add_argument("--model", type=Path, help="model directory (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--max-response-tokens", type=int, default=spec.defaults["max_response_tokens"])
    parser.add_argument("--eval-limit", type=int, help=f"evaluate on the first N test {spec.noun} only (smoke runs)")
    parser.add_argument(
        "--val-every",
        type=int,
        default=0,
        help="evaluate the first --val-limit val problems every N steps (greedy), before the first step and "
        "after the last: the run's validation curve; test is then evaluated once, after training, on the "
        "last adapter (default 0: no curve, test before and after as the trainer's own evaluation)",
    )
    parser.add_argument("--val-limit", type=int, default=30, help="how many val problems --val-every evaluates")
    add_before_argument(parser)
    parser.add_argument(
        "--merge",
        choices=["off", "prefix"],
        default="off",
        help="transitions.merge: 'prefix' trains each run of a rollout's calls whose token ids extend one "
        "another as one row (the arm's name ends in -merge; default off, the configs')",
    )
    parser.add_argument(
        "--backend-setting",
        action="append",
        default=[],
        type=backend_setting,
        metavar="KEY=VALUE",
        help="a setting of the verl backend over the example's (repeatable; the value is read as JSON, else "
        "as text): kl_coef=0.01, loss_agg_mode=seq-mean-token-mean, entropy_coeff=0.001, "
        "lr_scheduler_type=cosine, lr_warmup_steps=5; named in the arm "
        "(calc_agent-kl_coef=0.01)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming the workdir")
    add_logger_argument(parser)
    return parser


def parse_train_args(
    spec: ExampleSpec, argv: list[str] | None, description: str | None, parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, list[dict]]:
    """The options and the training tasks they pick; a usage error for bad ones, before anything runs."""
    parser = parser or train_parser(spec, description)
    args = parser.parse_args(argv)
    try:
        train = spec.subset.select(spec.load_split("train"), tuple(getattr(args, spec.subset.option)))
    except ValueError as exc:
        parser.error(f"--{exc}")
    spec.prepare_or_exit(parser, args)
    return args, train


def train_command(spec: ExampleSpec, description: str | None) -> Callable[[list[str] | None], int]:
    """An example's ``train`` command as a ``main(argv=None)`` function (``description``: its ``--help`` text)."""

    def main(argv: list[str] | None = None) -> int:
        """Train one seed and write its results file."""
        args, train = parse_train_args(spec, argv, description)
        return train_seed(spec, args, train)

    return main


RUNNER_SETTINGS = {
    "model_path": "--model",
    "seed": "--seed",
    "workdir": "--workdir",
    "temperature": "the example's sampling temperature, which its agents sample at too",
    "mode": "this runner trains in this process (local)",
}
"""Backend settings ``--backend-setting`` refuses: the runner sets them, from what is named here."""


def backend_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--backend-setting``: the value read as JSON, else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. kl_coef=0.01")
    if key in RUNNER_SETTINGS:
        raise argparse.ArgumentTypeError(f"{key}: set by the runner ({RUNNER_SETTINGS[key]}), not here")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def apply_backend_settings(config: dict[str, Any], settings: list[tuple[str, Any]]) -> None:
    """Put ``--backend-setting`` values over the backend's config, checked as the backend will check them
    (a ``SystemExit`` naming the setting and the reason, before anything runs)."""
    if not settings:
        return
    from pydantic import ValidationError

    from agl_verl.config import VerlSettings

    merged = {**config["backend"]["config"], **dict(settings)}
    try:
        VerlSettings.model_validate(merged)
    except ValidationError as exc:
        reasons = "; ".join(_reason(e) for e in exc.errors())
        raise SystemExit(f"--backend-setting: {reasons}") from None
    config["backend"]["config"] = merged


def _reason(error: Any) -> str:
    """One pydantic error as ``field: why`` (a check across fields names them in its message)."""
    field = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    return f"{field}: {message}" if field else message


def arm_name(spec: ExampleSpec, args: argparse.Namespace) -> str:
    """The run's name in its results file: the example's arm, with ``-merge`` where ``--merge prefix`` is on
    and ``-KEY=VALUE`` for each ``--backend-setting``."""
    settings = "".join(f"-{key}={value}" for key, value in sorted(dict(args.backend_setting).items()))
    return spec.arm(args) + ("-merge" if args.merge == "prefix" else "") + settings


def fresh_workdir(spec: ExampleSpec, args: argparse.Namespace, name: str) -> Path:
    """The run's work directory (emptied first with ``--fresh``)."""
    workdir = (args.workdir or Path("runs") / spec.runs / f"{name}-seed{args.seed}").resolve()
    if args.fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def train_seed(spec: ExampleSpec, args: argparse.Namespace, train: list[dict]) -> int:
    """Train one seed on ``train`` and write ``<arm>-seed<N>.json`` into ``args.results``."""
    import torch

    import agl
    from agl_trainer import Trainer
    from agl_trainer.transition_counts import TransitionCounts
    from agl_verl.models import smollm2_dir

    torch.set_num_threads(args.threads)
    name = arm_name(spec, args)
    workdir = fresh_workdir(spec, args, name)
    spec.register_reward(args)
    counter = TransitionCounts(workdir / "transition_counts.json")  # resumed runs count every step
    clock = RunClock(workdir / "wall.json")  # and their earlier processes' time
    agl.register_plugin(counter, name=f"{spec.runs}-transition-counts")
    agl.register_plugin(clock, name=f"{spec.runs}-run-clock")
    test = spec.load_split("test")[: args.eval_limit]
    config = spec.trainer_config(
        args,
        seed=args.seed,
        workdir=workdir,
        model_path=args.model or smollm2_dir(),
        steps=args.steps,
        batch_size=args.batch_size,
        n_rollouts=args.n_rollouts,
        max_response_tokens=args.max_response_tokens,
    )
    config["transitions"]["merge"] = args.merge
    apply_backend_settings(config, args.backend_setting)
    ordered = spec.task_order(args, train)  # a curriculum, or None: the trainer's seeded shuffle
    if ordered is not None:
        config["shuffle"] = False
    config["progress"] = sys.stderr.isatty()
    config = with_loggers(config, args)
    before = shared_before(args, config, test, spec.run_split, workdir.parent / "base-test")
    val = spec.load_split("val")[: args.val_limit] if args.val_every else []
    if val:
        config.update(val_every=args.val_every, val_before=True)
    try:
        tasks = train if ordered is None else ordered
        result = Trainer(config).fit(spec.agent, train_tasks=tasks, val_tasks=val or test)
    finally:
        agl.plugins.unregister(counter)
        agl.plugins.unregister(clock)

    evaluated = val or test
    figures = collect(spec, workdir, args.steps, {t["task_id"]: t["input"] for t in evaluated})
    if val:  # the trainer evaluated val; test once more, on the last adapter
        figures["val_before"], figures["val_after"] = figures.pop("before"), figures.pop("after")
        figures["val_curve"] = val_curve(workdir)
        policies = config.get("policies")
        figures["after"] = test_figures(spec, args, workdir, test, trained=True, policies=policies)
        if before is None:
            before = test_figures(spec, args, workdir, test, trained=False, policies=policies)
    wall_s = clock.wall_s()
    if before is not None:
        figures["before"] = before
    figures["before_source"] = BASE_FILE if before is not None else "this run"
    run = {"name": name, "steps": result.steps_completed, "wall_s": wall_s, "eval_tasks": len(test)}
    if val:
        run["val_tasks"] = len(val)
    record = results_record(spec, args, train, config, run, counter.by_agent, figures, workdir)
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{name}-seed{args.seed}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(result.summary())
    b, a = record["before"][spec.score], record["after"][spec.score]
    print(f"test {spec.score} {b:.3f} -> {a:.3f}; wall {wall_s:.0f}s; results in {out}")
    return 0


def results_record(
    spec: ExampleSpec,
    args: argparse.Namespace,
    train: list[dict],
    config: dict[str, Any],
    run: dict[str, Any],
    trained_transitions: dict[str, int],
    figures: dict[str, Any],
    workdir: Path,
) -> dict[str, Any]:
    """The results file of a finished run (``run``: its arm's name, steps completed, wall seconds, test tasks)."""
    metrics = train_metrics(workdir)
    step_times = [r["time_step_s"] for r in metrics if "time_step_s" in r]
    curve, metric = spec.curve
    return {
        spec.arm_key: run["name"],
        "seed": args.seed,
        "steps": run["steps"],
        "batch_size": args.batch_size,
        "n_rollouts": args.n_rollouts,
        **spec.record_extras(args, train),
        "temperature": config["rollout"]["resources"]["temperature"],
        "lr": config["backend"]["config"]["lr"],
        "transitions_config": config["transitions"],
        **({"policies": config["policies"]} if config.get("policies") else {}),
        "wall_s": round(run["wall_s"], 1),
        "step_s": [round(s, 1) for s in step_times],
        "step_s_mean": round(sum(step_times) / len(step_times), 1) if step_times else None,
        curve: [round(r.get(metric, 0.0), 4) for r in metrics],
        "train_signal_share": [signal_share(r) for r in metrics],
        "max_response_tokens": args.max_response_tokens,
        "eval_split": "test",
        f"eval_{spec.noun}": run["eval_tasks"],
        **({"val_every": args.val_every, "val_problems": run["val_tasks"]} if "val_tasks" in run else {}),
        "trained_transitions": dict(sorted(trained_transitions.items())),
        **({"merge": merge_figures(metrics)} if args.merge != "off" else {}),
        **({"backend_settings": dict(args.backend_setting)} if args.backend_setting else {}),
        **figures,
        "workdir": repo_relative(workdir),
        "commit": commit_of(REPO),
    }


def signal_share(step: dict[str, Any]) -> float:
    """The share of a step's trained rows whose GRPO group had a signal (the backends' ``transitions_with_signal``,
    each policy's in a run of several, over the rows built)."""
    rows = step.get("transitions", 0.0)
    with_signal = sum(v for k, v in step.items() if k.split("/")[-1] == "transitions_with_signal")
    return round(with_signal / rows, 4) if rows else 0.0


def merge_figures(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What merging did over a run's steps: calls merged, rows, learner tokens both ways, update seconds.

    ``learner_tokens`` are the prompt and response tokens of the rows the learner trained on;
    ``unmerged_tokens`` those of the same calls as rows of their own. ``breaks`` counts the calls
    that started a new row after a call of their rollout, by reason.
    """

    def per_step(key: str) -> list[float]:
        return [round(r.get(key, 0.0), 2) for r in metrics]

    breaks: dict[str, int] = {}
    for r in metrics:
        for key, n in r.items():
            if key.startswith("build_merge_break_"):
                reason = key.removeprefix("build_merge_break_")
                breaks[reason] = breaks.get(reason, 0) + int(n)
    steps = {
        "merged_calls": per_step("build_merged_calls"),
        "rows": per_step("transitions"),
        "learner_tokens": per_step("learner_tokens"),
        "unmerged_tokens": per_step("build_unmerged_tokens"),
        "update_s": per_step("time_update_s"),
    }
    totals = {key: round(sum(values), 2) for key, values in steps.items()}
    return {"total": totals, "breaks": dict(sorted(breaks.items())), "by_step": steps}


def val_curve(workdir: Path) -> list[dict[str, float]]:
    """The validation success rate at each evaluation of the run (step 0: before the first step)."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [
        {"step": r["step"], "success_rate": round(r["val_success_rate"], 4)} for r in records if "val_success_rate" in r
    ]


def test_figures(
    spec: ExampleSpec,
    args: argparse.Namespace,
    workdir: Path,
    test: list[dict],
    *,
    trained: bool,
    policies: list[dict] | None = None,
) -> dict[str, Any]:
    """The test split's figures (greedy, as the shared base's are evaluated) on the run's last published
    adapter (``trained``) or on the model it started from; a run of ``policies`` is served as it
    trained, each trained policy its own last adapter and each frozen one its weights."""
    from agl_verl.models import checkpoint_dir, smollm2_dir
    from examples.evaluation import policy_adapters

    adapter: Path | dict[str, Path] | None = None
    if trained and policies:
        adapter = policy_adapters(workdir, policies)
    elif trained:
        adapter = checkpoint_dir(workdir)
    return spec.run_split(
        test,
        model_path=args.model or smollm2_dir(),
        adapter=adapter,
        **({"policies": policies} if policies else {}),
        workdir=workdir / ("test-after" if trained else "test-before"),
        max_response_tokens=args.max_response_tokens,
    )


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository (results files hold no absolute paths of the machine that ran them)."""
    return os.path.relpath(Path(path).resolve(), REPO)


def commit_of(repo: Path) -> str | None:
    """The commit checked out at ``repo`` (``-dirty`` when tracked files differ from it), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=repo, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def train_metrics(workdir: Path) -> list[dict[str, Any]]:
    """The training steps' records of the run's ``metrics.jsonl``, in order."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r.get("kind") == "train"]


def collect(spec: ExampleSpec, workdir: Path, steps: int, tasks: dict[str, dict]) -> dict[str, Any]:
    """Before/after summaries of the test split and the training rollouts' figures, read from the run's store.

    The trainer's evaluations are its val rollouts of step 0 (before the first step) and of
    step ``steps + 1`` (after the last); of a step a resumed run ran again, the rerun's count
    (:func:`agl_trainer.rollout_ids.latest_by_step`).
    """
    from agl.store.base import open_store
    from agl_trainer.rollout_ids import latest_by_step

    state = json.loads((workdir / "trainer_state.json").read_text())
    run = state["run_id"]
    store = open_store(f"sqlite:///{workdir / 'agl.db'}", create=False)
    try:
        counted = latest_by_step(store.query_rollouts(), run)
        before = [r for r in counted if r.mode == "val" and "-val0-" in r.rollout_id]
        after = [r for r in counted if r.mode == "val" and f"-val{steps + 1}-" in r.rollout_id]
        train = [r for r in counted if r.mode == "train"]
        return {
            "run_id": run,
            "before": spec.summarize(before, tasks, store) if before else None,
            "after": spec.summarize(after, tasks, store),
            **spec.train_figures(store, train),
        }
    finally:
        store.close()
