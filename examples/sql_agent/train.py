"""Train the SQL agent (agent.py) with reinforcement learning, one arm and one seed.

SmolLM2-135M-Instruct with a LoRA adapter, the transformers engine behind the agl
gateway, verl's GRPO advantages and PPO loss in the local backend, all in this
process. The trainer evaluates the test split greedily before the first step and after
the last one (``val_every: 0``: nothing is evaluated, selected or tuned on it in
between). The figures go to ``results/<arm>-seed<N>.json``; ``report.py`` builds the
README table from those files.

    python examples/sql_agent/train.py --seed 0 [--arm main|broadcast|last|emitted|all-agents] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import agl  # noqa: E402
from agl_trainer.transition_counts import TransitionCounts  # noqa: E402
from sql_agent import rewards  # noqa: E402
from sql_agent.agent import sql_agent  # noqa: E402
from sql_agent.config import (  # noqa: E402
    ARMS,
    BATCH_SIZE,
    MAX_RESPONSE_TOKENS,
    N_ROLLOUTS,
    STEPS,
    TRAIN_TIERS,
    trainer_config,
)
from sql_agent.database import DB_ENV, db_path  # noqa: E402
from sql_agent.evaluation import agent_calls, run_split, summarize, timed  # noqa: E402
from sql_agent.questions import TIERS, load_split, of_tiers  # noqa: E402

REWARD_PLUGIN = "sql-execution-match"


def register_reward() -> None:
    """Register the reward plugin once (the user's way: ``agl.register_plugin``)."""
    from agl.plugins import get_plugin_manager

    if get_plugin_manager().get_plugin(REWARD_PLUGIN) is None:
        agl.register_plugin(rewards, name=REWARD_PLUGIN)


def shared_base(path: Path, test: list[dict], max_response_tokens: int, workdir: Path) -> dict:
    """The base model's test figures, evaluated once and kept in ``path`` for every run.

    Every arm and seed starts from the same base model, evaluated greedily on the same
    questions with the same response cap, so its "before" is one evaluation, not one per
    run. The file is used only if it was made for these questions and this cap.
    """
    from agl_verl.models import smollm2_dir

    key = {"task_ids": [t["task_id"] for t in test], "max_response_tokens": max_response_tokens}
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return saved["summary"]
    summary, seconds = timed(
        run_split, test, model_path=smollm2_dir(), workdir=workdir, max_response_tokens=max_response_tokens
    )
    summary["wall_s"] = round(seconds, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "summary": summary}, indent=1) + "\n")
    return summary


def train_success_by_step(workdir: Path) -> list[float]:
    """The training rollouts' success rate of each step, from the run's ``metrics.jsonl``."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [round(r["success_rate"], 4) for r in records if r.get("kind") == "train"]


def collect(workdir: Path, steps: int, tasks: dict[str, dict], n_val: int) -> dict:
    """Before/after summaries and training-call counts, read from the run's store."""
    from agl.store.base import open_store

    state = json.loads((workdir / "trainer_state.json").read_text())
    run = state["run_id"]
    store = open_store(f"sqlite:///{workdir / 'agl.db'}", create=False)
    try:

        def ended(ids: list[str]):
            return list(store.query_rollouts(rollout_ids=ids))

        before = ended([f"{run}-val0-{i}" for i in range(n_val)])
        after = ended([f"{run}-val{steps + 1}-{i}" for i in range(n_val)])
        train_ids = [r.rollout_id for r in store.query_rollouts() if r.mode == "train"]
        return {
            "run_id": run,
            "before": summarize(before, tasks, store) if before else None,
            "after": summarize(after, tasks, store),
            "train_agent_calls": agent_calls(store, train_ids),
            "train_rollouts": len(train_ids),
        }
    finally:
        store.close()


def refresh(out: Path, test: list[dict], base_file: Path) -> dict:
    """Recompute a finished run's figures from its workdir's store with the current :func:`summarize`.

    For a results file written before a figure was added. The shared base figures in
    ``base_file`` are recomputed from the store ``shared_base`` left beside the run.
    """
    from agl.store.base import open_store

    record = json.loads(out.read_text())
    workdir = Path(record["workdir"])
    tasks = {t["task_id"]: t["input"] for t in test}
    figures = collect(workdir, record["steps"], tasks, record["eval_questions"])
    if record["before_source"] != "this run":
        saved = json.loads(base_file.read_text())
        store = open_store(f"sqlite:///{workdir.parent / 'base-test' / 'agl.db'}", create=False)
        try:
            rollouts = list(store.query_rollouts())
            if sorted(r.task_id for r in rollouts) != sorted(tasks):
                raise SystemExit(f"{workdir.parent / 'base-test'}: not one evaluation of these {len(tasks)} questions")
            base = summarize(rollouts, tasks, store)
        finally:
            store.close()
        saved["summary"] = {**base, "wall_s": saved["summary"]["wall_s"]}
        base_file.write_text(json.dumps(saved, indent=1) + "\n")
        figures["before"] = saved["summary"]
    record.update(figures, train_success_by_step=train_success_by_step(workdir))
    out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    """Train one arm with one seed and write its results file."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arm", choices=sorted(ARMS), default="main")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="tasks per step")
    parser.add_argument("--n-rollouts", type=int, default=N_ROLLOUTS, help="rollouts per task (the GRPO group)")
    parser.add_argument(
        "--tiers", nargs="+", choices=TIERS, default=list(TRAIN_TIERS), help="the train split's tiers to train on"
    )
    parser.add_argument("--workdir", type=Path, help="default: runs/sql-agent/<arm>-seed<N>")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="where <arm>-seed<N>.json goes")
    parser.add_argument("--db", help=f"Chinook.db (default: ${DB_ENV} or ../shared/data/chinook/Chinook.db)")
    parser.add_argument("--model", type=Path, help="model directory (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--max-response-tokens", type=int, default=MAX_RESPONSE_TOKENS)
    parser.add_argument("--eval-limit", type=int, help="evaluate on the first N test questions only (smoke runs)")
    parser.add_argument(
        "--before",
        choices=["shared", "run"],
        default="shared",
        help="shared: the base model's test figures from results/base/test.json (evaluated once, "
        "then reused by every run); run: evaluate the base in this run (always with --model or --eval-limit)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming the workdir")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="no training: recompute the figures of this arm and seed's results file from the store of its run",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    if args.db:
        os.environ[DB_ENV] = str(Path(args.db).resolve())
    db_path()  # no database, no rewards: say so now, not as a run of zeros
    name = f"{args.arm}-seed{args.seed}"
    if args.refresh:
        test = load_split("test")[: args.eval_limit]
        record = refresh(args.results / f"{name}.json", test, args.results / "base" / "test.json")
        print(f"{name}: test success {record['before']['success']:.3f} -> {record['after']['success']:.3f}")
        return 0
    import torch

    from agl_trainer import Trainer
    from agl_verl.models import smollm2_dir

    torch.set_num_threads(args.threads)
    workdir = (args.workdir or Path("runs") / "sql-agent" / name).resolve()
    if args.fresh and workdir.exists():
        import shutil

        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    register_reward()
    counter = TransitionCounts()
    agl.register_plugin(counter, name="sql-agent-transition-counts")
    train, test = of_tiers(load_split("train"), tuple(args.tiers)), load_split("test")[: args.eval_limit]
    config = trainer_config(
        args.arm,
        seed=args.seed,
        workdir=workdir,
        model_path=args.model or smollm2_dir(),
        steps=args.steps,
        batch_size=args.batch_size,
        n_rollouts=args.n_rollouts,
        max_response_tokens=args.max_response_tokens,
    )
    config["progress"] = sys.stderr.isatty()
    shared = args.before == "shared" and args.model is None and args.eval_limit is None
    before = None
    if shared:
        base_file = args.results / "base" / "test.json"
        before = shared_base(base_file, test, args.max_response_tokens, workdir.parent / "base-test")
        config["val_before"] = False
    try:
        result = Trainer(config).fit(sql_agent, train_tasks=train, val_tasks=test)
    finally:
        agl.plugins.unregister(counter)
    wall_s = time.monotonic() - started

    figures = collect(workdir, args.steps, {t["task_id"]: t["input"] for t in test}, len(test))
    if shared:
        figures["before"] = before
    figures["before_source"] = "results/base/test.json" if shared else "this run"
    step_times = [r["time_step_s"] for r in result.history if r.get("kind") == "train" and "time_step_s" in r]
    record = {
        "arm": args.arm,
        "seed": args.seed,
        "steps": result.steps_completed,
        "batch_size": args.batch_size,
        "n_rollouts": args.n_rollouts,
        "train_tiers": list(args.tiers),
        "transitions_config": config["transitions"],
        "wall_s": round(wall_s, 1),
        "step_s_mean": round(sum(step_times) / len(step_times), 1) if step_times else None,
        "max_response_tokens": args.max_response_tokens,
        "eval_split": "test",
        "eval_questions": len(test),
        "trained_transitions": dict(sorted(counter.by_agent.items())),
        "train_success_by_step": train_success_by_step(workdir),
        **figures,
        "workdir": str(workdir),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{name}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(result.summary())
    b, a = record["before"], record["after"]
    print(f"test success {b['success']:.3f} -> {a['success']:.3f}; wall {wall_s:.0f}s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
