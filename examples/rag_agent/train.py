"""Train the retrieval agent (agent.py) with reinforcement learning, one seed.

SmolLM2-135M-Instruct with a LoRA adapter, the transformers engine behind the agl
gateway, verl's GRPO advantages and PPO loss in the local backend, all in this
process. It trains on the one-hop questions (``--hops``). The test split, both hops, is
evaluated greedily after the last step; the base model's figures are evaluated once and
shared by every seed (``results/base/test.json``). Nothing is evaluated, selected or
tuned on test in between (``val_every: 0``). The figures go to
``results/<arm>-seed<N>.json``: the arm is ``rag_agent`` with the config's hops and
batch size, and names the others (``rag_agent-hops1-2-batch2``).

    python examples/rag_agent/train.py --seed 0 [--hops 1 2] [--steps N] [--batch-size N] [--n-rollouts N]
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

from baseline import BASE_FILE, add_before_argument, shared_before  # noqa: E402

import agl  # noqa: E402
from rag_agent import rewards  # noqa: E402
from rag_agent.agent import rag_agent  # noqa: E402
from rag_agent.config import (  # noqa: E402
    BATCH_SIZE,
    MAX_RESPONSE_TOKENS,
    N_ROLLOUTS,
    STEPS,
    TRAIN_HOPS,
    trainer_config,
)
from rag_agent.evaluation import run_split, summarize  # noqa: E402
from rag_agent.questions import load_split, of_hops  # noqa: E402

REWARD_PLUGIN = "rag-token-f1"
NAME = "rag_agent"


def register_reward() -> None:
    """Register the reward plugin once (the user's way: ``agl.register_plugin``)."""
    from agl.plugins import get_plugin_manager

    if get_plugin_manager().get_plugin(REWARD_PLUGIN) is None:
        agl.register_plugin(rewards, name=REWARD_PLUGIN)


def arm(hops: tuple[int, ...], batch_size: int, steps: int = STEPS) -> str:
    """The run's name in its results file: ``rag_agent``, plus what differs from the config."""
    parts = [NAME]
    if tuple(hops) != TRAIN_HOPS:
        parts.append("hops" + "-".join(str(n) for n in sorted(hops)))
    if batch_size != BATCH_SIZE:
        parts.append(f"batch{batch_size}")
    if steps != STEPS:
        parts.append(f"steps{steps}")
    return "-".join(parts)


def collect(workdir: Path, steps: int, tasks: dict[str, dict], n_val: int) -> dict:
    """Before/after summaries of the test split and the training rollouts' figures, read from the run's store."""
    from agl.store.base import open_store

    state = json.loads((workdir / "trainer_state.json").read_text())
    run = state["run_id"]
    store = open_store(f"sqlite:///{workdir / 'agl.db'}", create=False)
    try:

        def ended(ids: list[str]):
            return list(store.query_rollouts(rollout_ids=ids))

        before = ended([f"{run}-val0-{i}" for i in range(n_val)])
        after = ended([f"{run}-val{steps + 1}-{i}" for i in range(n_val)])
        train = [r for r in store.query_rollouts() if r.mode == "train"]
        train_tasks = {t.task_id: t.input for t in store.query_tasks()}
        return {
            "run_id": run,
            "before": summarize(before, tasks, store) if before else None,
            "after": summarize(after, tasks, store),
            "train": summarize(train, train_tasks, store) if train else None,
        }
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """Train one seed and write its results file."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="tasks per step")
    parser.add_argument("--n-rollouts", type=int, default=N_ROLLOUTS, help="rollouts per task (the GRPO group)")
    parser.add_argument(
        "--hops",
        type=int,
        nargs="+",
        default=list(TRAIN_HOPS),
        help="train on the train split's questions of these numbers of hops (1, 2)",
    )
    parser.add_argument("--workdir", type=Path, help="default: runs/rag-agent/<arm>-seed<N>")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="where <arm>-seed<N>.json goes")
    parser.add_argument("--model", type=Path, help="model directory (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--max-response-tokens", type=int, default=MAX_RESPONSE_TOKENS)
    parser.add_argument("--eval-limit", type=int, help="evaluate on the first N test questions only (smoke runs)")
    add_before_argument(parser)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming the workdir")
    args = parser.parse_args(argv)
    try:  # before anything is deleted, loaded or registered
        train = of_hops(load_split("train"), tuple(args.hops))
    except ValueError as exc:
        parser.error(f"--{exc}")
    name = arm(tuple(args.hops), args.batch_size, args.steps)

    started = time.monotonic()
    import torch

    from agl_trainer import Trainer
    from agl_verl.models import smollm2_dir

    torch.set_num_threads(args.threads)
    workdir = (args.workdir or Path("runs") / "rag-agent" / f"{name}-seed{args.seed}").resolve()
    if args.fresh and workdir.exists():
        import shutil

        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    register_reward()
    test = load_split("test")[: args.eval_limit]
    config = trainer_config(
        seed=args.seed,
        workdir=workdir,
        model_path=args.model or smollm2_dir(),
        steps=args.steps,
        batch_size=args.batch_size,
        n_rollouts=args.n_rollouts,
        max_response_tokens=args.max_response_tokens,
    )
    config["progress"] = sys.stderr.isatty()
    before = shared_before(args, config, test, run_split, workdir.parent / "base-test")
    result = Trainer(config).fit(rag_agent, train_tasks=train, val_tasks=test)
    wall_s = time.monotonic() - started

    figures = collect(workdir, args.steps, {t["task_id"]: t["input"] for t in test}, len(test))
    if before is not None:
        figures["before"] = before
    figures["before_source"] = BASE_FILE if before is not None else "this run"
    train_steps = [r for r in result.history if r.get("kind") == "train"]
    step_times = [r["time_step_s"] for r in train_steps if "time_step_s" in r]
    record = {
        "name": name,
        "seed": args.seed,
        "steps": result.steps_completed,
        "batch_size": args.batch_size,
        "n_rollouts": args.n_rollouts,
        "train_hops": sorted(args.hops),
        "train_questions": len(train),
        "temperature": config["rollout"]["resources"]["temperature"],
        "lr": config["backend"]["config"]["lr"],
        "wall_s": round(wall_s, 1),
        "step_s": [round(s, 1) for s in step_times],
        "train_f1_by_step": [round(r.get("reward_mean", 0.0), 4) for r in train_steps],
        "max_response_tokens": args.max_response_tokens,
        "eval_split": "test",
        "eval_questions": len(test),
        **figures,
        "workdir": str(workdir),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{name}-seed{args.seed}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(result.summary())
    b, a = record["before"], record["after"]
    print(f"test F1 {b['f1']:.3f} -> {a['f1']:.3f}; wall {wall_s:.0f}s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
