"""The calculator agent in production, then trained on what it did there: ``from_store`` in three acts.

    python -m examples.calc_agent.production --seed 0 [--graded 1.0] [--fresh]

1. **Traffic.** The base model is served behind the gateway, and the unmodified agent runs on
   240 training problems (two operations) drawn at random with the seed, at the training
   temperature, each run recorded as a production rollout, as ``agl run`` records one: its
   calls with token ids and behaviour log-probs, its output, no reward. This store
   (``runs/calc-agent/production-seed<N>/traffic.db``) is made once a seed and copied for each arm.
2. **Feedback.** A separate process, ``python -m examples.calc_agent.production feedback
   --store URL --graded F --seed N``, grades what it can afterwards and attaches a reward
   (source ``user``) through the store: every rollout (``--graded 1``), or a seeded half.
3. **Training.** ``agl train --from-store``, as a config: 10 steps of 24 recorded rollouts
   (the on-policy arm's 240 rollouts), oldest first, each once; rollouts of one task in a step
   form a GRPO group, the step's singletons one group of their own; verl's decoupled
   token-level importance sampling (``decoupled_token_is``) corrects for the sampling policy.
   No reward plugin: only the feedback's rewards count, and an ungraded rollout is not
   trained on. The test split is evaluated after the last step (before: the base figures
   every arm shares), into ``results/calc_agent-production[-graded0.5]-seed<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .config import BATCH_SIZE, N_ROLLOUTS, STEPS, TEMPERATURE, TRAIN_OPERATIONS, trainer_config
from .problems import load_split, of_operations
from .spec import SPEC

CORRECTION = "decoupled_token_is"


def traffic(seed: int, rollouts: int, store_path: Path, model_path: Path, max_response_tokens: int) -> None:
    """Act 1: the base model serves the agent on ``rollouts`` random training problems, recorded as production."""
    from agl.schema import Task
    from agl.store.base import open_store
    from agl_trainer.evaluation import evaluate

    from .agent import calc_agent

    problems = of_operations(load_split("train"), TRAIN_OPERATIONS)
    drawn = random.Random(seed).choices(problems, k=rollouts)
    tasks = [Task(task_id=p["task_id"], input=p["input"], split="train") for p in drawn]
    store = open_store(f"sqlite:///{store_path}")
    try:
        evaluate(
            calc_agent,
            tasks,
            store=store,
            model_path=model_path,
            temperature=TEMPERATURE,
            max_response_tokens=max_response_tokens,
            mode="production",
            seed=seed,
        )
    finally:
        store.close()


def feedback(store_url: str, graded: float, seed: int) -> int:
    """Act 2: a reward for the production rollouts this grader can grade (a seeded ``graded`` share)."""
    from agl.schema import Reward
    from agl.store.base import open_store

    from .rewards import final_reply, numeric_match

    store = open_store(store_url, create=False)
    try:
        rollouts = [r for r in store.query_rollouts() if r.mode == "production" and r.status.terminal]
        answers = {i: t.input["answer"] for i, t in store.get_tasks([r.task_id for r in rollouts]).items()}
        chosen = random.Random(seed).sample(rollouts, round(graded * len(rollouts)))
        grade = {r.rollout_id: numeric_match(final_reply(r.output), answers[r.task_id]) for r in chosen}
        rewards = [Reward(rollout_id=rid, value=value, source="user") for rid, value in grade.items()]
        store.add_rewards(rewards)
    finally:
        store.close()
    print(f"feedback: graded {len(rewards)} of {len(rollouts)} rollouts, {sum(w.value for w in rewards):.0f} right")
    return 0


def recorded_figures(workdir: Path) -> dict:
    """The recorded rollouts' count and tool-call figures (the results file's ``train_*``)."""
    from agl.store.base import open_store

    store = open_store(f"sqlite:///{workdir / 'agl.db'}", create=False)
    try:
        return SPEC.train_figures(store, [r for r in store.query_rollouts() if r.mode == "production"])
    finally:
        store.close()


def arm_name(graded: float) -> str:
    return "calc_agent-production" if graded == 1.0 else f"calc_agent-production-graded{graded:g}"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["feedback"]:
        p = argparse.ArgumentParser(prog="python -m examples.calc_agent.production feedback")
        p.add_argument("--store", required=True)
        p.add_argument("--graded", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=0)
        a = p.parse_args(argv[1:])
        return feedback(a.store, a.graded, a.seed)
    p = argparse.ArgumentParser(prog="python -m examples.calc_agent.production", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graded", type=float, default=1.0, help="the share of rollouts the feedback grades")
    p.add_argument("--fresh", action="store_true", help="train again (the traffic of the seed is kept)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--workdir", type=Path, help=f"default: runs/{SPEC.runs}/production-seed<N>")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="rollouts per step: batch size x n-rollouts")
    p.add_argument("--n-rollouts", type=int, default=N_ROLLOUTS)
    p.add_argument("--max-response-tokens", type=int, default=64)
    p.add_argument("--model", type=Path, help="model directory (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--eval-limit", type=int, help="evaluate on the first N test problems only (smoke runs)")
    args = p.parse_args(argv)
    if not 0 < args.graded <= 1:
        p.error(f"--graded: must be in (0, 1], got {args.graded}")
    return train_on_traffic(args)


def train_on_traffic(args: argparse.Namespace) -> int:
    """Acts 1 to 3 for one seed and one grading share; the results file of the arm."""
    import torch

    import agl
    from agl_trainer import Trainer
    from agl_trainer.transition_counts import TransitionCounts
    from agl_verl.models import smollm2_dir
    from examples.baseline import BASE_FILE
    from examples.training import collect, results_record, train_parser

    from .agent import calc_agent

    started = time.monotonic()
    torch.set_num_threads(args.threads)
    model = args.model or smollm2_dir()
    per_step = args.batch_size * args.n_rollouts
    root = (args.workdir or Path("runs") / SPEC.runs / f"production-seed{args.seed}").resolve()
    root.mkdir(parents=True, exist_ok=True)
    traffic_db = root / "traffic.db"
    if not (root / "traffic.done").exists():
        traffic(args.seed, args.steps * per_step, traffic_db, model, args.max_response_tokens)
        (root / "traffic.done").write_text("")
    name = arm_name(args.graded)
    workdir = root / name
    if args.fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "agl.db").exists():
        shutil.copy(traffic_db, workdir / "agl.db")
        url = f"sqlite:///{workdir / 'agl.db'}"
        cmd = [sys.executable, "-m", "examples.calc_agent.production", "feedback", "--store", url]
        subprocess.run([*cmd, "--graded", str(args.graded), "--seed", str(args.seed)], check=True)
    run = {"steps": args.steps, "batch_size": args.batch_size, "n_rollouts": args.n_rollouts}
    config = trainer_config(seed=args.seed, workdir=workdir, model_path=model, **run)
    config["rollout"]["max_response_tokens"] = args.max_response_tokens
    config["from_store"] = {"modes": ["production"], "rollouts_per_step": per_step}
    config["backend"]["config"]["rollout_correction"] = CORRECTION
    config["val_before"] = False
    config["progress"] = sys.stderr.isatty()
    test = load_split("test")[: args.eval_limit]
    counter = TransitionCounts()
    agl.register_plugin(counter, name="calc-production-transition-counts")
    try:
        result = Trainer(config).fit(calc_agent, [], test)
    finally:
        agl.plugins.unregister(counter)

    figures = collect(SPEC, workdir, args.steps, {t["task_id"]: t["input"] for t in test})
    figures.update(recorded_figures(workdir))
    base = args.results / "base" / "test.json"
    shared = args.model is None and args.eval_limit is None and base.exists()
    figures["before"] = json.loads(base.read_text()) if shared else None
    figures["before_source"] = BASE_FILE if shared else None
    wall = time.monotonic() - started
    done = {"name": name, "steps": result.steps_completed, "wall_s": wall, "eval_tasks": len(test)}
    for option, default in vars(train_parser(SPEC, None).parse_args([])).items():
        if not hasattr(args, option):  # the train command's options this command does not take: their defaults
            setattr(args, option, default)
    record = results_record(SPEC, args, [], config, done, counter.by_agent, figures, workdir)
    record.update({"graded": args.graded, "rollout_correction": CORRECTION, "recorded_rollouts": args.steps * per_step})
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{name}-seed{args.seed}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"test success after training on recorded traffic: {record['after']['success']:.3f}; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
