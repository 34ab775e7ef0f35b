"""Train the calculator agent (agent.py) with reinforcement learning, one seed.

SmolLM2-135M-Instruct with a LoRA adapter, the transformers engine behind the agl
gateway, verl's GRPO advantages and PPO loss in the local backend, all in this
process. The test split is evaluated greedily before the first step and after the
last one (``val_every: 0``: nothing is evaluated, selected or tuned on it in between).
The figures, tool-call validity and tool calls per episode included, go to
``results/<arm>-seed<N>.json``: the arm is ``calc_agent`` with the config's lr and
optimizer steps, and names what differs (``calc_agent-lr0.001``, ``calc_agent-skip``).

    python examples/calc_agent/train.py --seed 0 [--lr LR] [--steps-without-signal skip] [--steps N]
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
from agl_trainer.transition_counts import TransitionCounts  # noqa: E402
from calc_agent import rewards  # noqa: E402
from calc_agent.agent import calc_agent  # noqa: E402
from calc_agent.config import (  # noqa: E402
    BATCH_SIZE,
    LR,
    MAX_RESPONSE_TOKENS,
    N_ROLLOUTS,
    STEPS,
    TRAIN_OPERATIONS,
    trainer_config,
)
from calc_agent.evaluation import run_split, summarize  # noqa: E402
from calc_agent.problems import load_split, of_operations  # noqa: E402
from calc_agent.tool_calls import tool_call_figures  # noqa: E402

NAME = "calc_agent"
REWARD_PLUGIN = "calc-numeric-match"


def register_reward() -> None:
    """Register the reward plugin once (the user's way: ``agl.register_plugin``)."""
    from agl.plugins import get_plugin_manager

    if get_plugin_manager().get_plugin(REWARD_PLUGIN) is None:
        agl.register_plugin(rewards, name=REWARD_PLUGIN)


def arm(lr: float, steps_without_signal: str) -> str:
    """The run's name in its results file: ``calc_agent``, plus what differs from the config."""
    name = NAME if lr == LR else f"{NAME}-lr{lr:g}"
    return name if steps_without_signal == "step" else f"{name}-{steps_without_signal}"


def collect(workdir: Path, steps: int, tasks: dict[str, dict], n_val: int) -> dict:
    """Before/after summaries and the training rollouts' tool-call figures, read from the run's store."""
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
            "train_rollouts": len(train_ids),
            "train_tool_calls": tool_call_figures(store.query_llm_calls(rollout_ids=train_ids), len(train_ids)),
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
        "--operations",
        type=int,
        nargs="+",
        default=list(TRAIN_OPERATIONS),
        help="train on the train split's problems of these numbers of operations",
    )
    parser.add_argument(
        "--lr", type=float, default=LR, help=f"LoRA learning rate (not {LR:g}: named in the results file)"
    )
    parser.add_argument(
        "--steps-without-signal",
        choices=["step", "skip"],
        default="step",
        help="on a step where no group has signal: step (AdamW on zero gradients, as verl) or skip "
        "(no optimizer step); skip is named in the results file",
    )
    parser.add_argument("--workdir", type=Path, help="default: runs/calc-agent/<arm>-seed<N>")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="where <arm>-seed<N>.json goes")
    parser.add_argument("--model", type=Path, help="model directory (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--max-response-tokens", type=int, default=MAX_RESPONSE_TOKENS)
    parser.add_argument("--eval-limit", type=int, help="evaluate on the first N test problems only (smoke runs)")
    add_before_argument(parser)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming the workdir")
    args = parser.parse_args(argv)
    try:  # before anything is deleted, loaded or registered
        train = of_operations(load_split("train"), tuple(args.operations))
    except ValueError as exc:
        parser.error(f"--{exc}")

    started = time.monotonic()
    import torch

    from agl_trainer import Trainer
    from agl_verl.models import smollm2_dir

    torch.set_num_threads(args.threads)
    name = arm(args.lr, args.steps_without_signal)
    workdir = (args.workdir or Path("runs") / "calc-agent" / f"{name}-seed{args.seed}").resolve()
    if args.fresh and workdir.exists():
        import shutil

        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    register_reward()
    counter = TransitionCounts()
    agl.register_plugin(counter, name="calc-agent-transition-counts")
    test = load_split("test")[: args.eval_limit]
    config = trainer_config(
        seed=args.seed,
        workdir=workdir,
        model_path=args.model or smollm2_dir(),
        steps=args.steps,
        batch_size=args.batch_size,
        n_rollouts=args.n_rollouts,
        max_response_tokens=args.max_response_tokens,
        lr=args.lr,
        steps_without_signal=args.steps_without_signal,
    )
    config["progress"] = sys.stderr.isatty()
    before = shared_before(args, config, test, run_split, workdir.parent / "base-test")
    try:
        result = Trainer(config).fit(calc_agent, train_tasks=train, val_tasks=test)
    finally:
        agl.plugins.unregister(counter)
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
        "train_operations": list(args.operations),
        "temperature": config["rollout"]["resources"]["temperature"],
        "lr": config["backend"]["config"]["lr"],
        "steps_without_signal": args.steps_without_signal,
        "transitions_config": config["transitions"],
        "wall_s": round(wall_s, 1),
        "step_s": [round(s, 1) for s in step_times],
        "step_s_mean": round(sum(step_times) / len(step_times), 1) if step_times else None,
        "train_success_by_step": [round(r.get("success_rate", 0.0), 4) for r in train_steps],
        "max_response_tokens": args.max_response_tokens,
        "eval_split": "test",
        "eval_problems": len(test),
        "trained_transitions": dict(sorted(counter.by_agent.items())),
        **figures,
        "workdir": str(workdir),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{record['name']}-seed{args.seed}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(result.summary())
    b, a = record["before"], record["after"]
    print(
        f"test success {b['success']:.3f} -> {a['success']:.3f}; tool-call validity "
        f"{b.get('tool_call_validity')} -> {a.get('tool_call_validity')}; wall {wall_s:.0f}s; results in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
