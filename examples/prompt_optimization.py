"""Prompt optimization (agl-apo) on the calculator or the SQL agent: one arm, one seed, test before and after.

    python -m examples.prompt_optimization --agent calc --arm both --seed 0
    python -m examples.prompt_optimization --agent sql --arm textual --seed 1 --optimizer-url URL --optimizer-model M

SmolLM2-135M-Instruct is the agent, served by the transformers engine behind the agl gateway;
its weights never change. The ``apo`` backend rewrites the agent's prompt resources from the
training rollouts (the train split's tasks of the example's training subset, sampled at the
example's temperature) and scores every candidate greedily on a batch of the val split. Arms:

- ``demos``: demonstrations bootstrapped from successful rollouts (no optimizer model);
- ``textual``: textual gradients, critiques and rewrites written by SmolLM2 itself (the run's own
  engine, ``optimizer.engine: true``) unless ``--optimizer-url`` names another model;
- ``both``: the two together.

The test split is never seen by the search. "before" is the base model with the example's own
prompts on test: ``results/base/test.json`` (the same model, prompts, cap and greedy sampling)
when the whole split is evaluated, else evaluated here; "after" is the same evaluation with the
best resources the search found. Results go to ``examples/<agent>/results/apo-<arm>-seed<N>.json``;
``--report`` prints the table of every such file of the agent (every arm and seed) instead of running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from examples.training import REPO, commit_of, repo_relative

HERE = Path(__file__).resolve().parent
AGENTS = {"calc": "examples.calc_agent", "sql": "examples.sql_agent"}
ARMS = {"demos": ["bootstrap_demos"], "textual": ["textual_gradient"], "both": ["textual_gradient", "bootstrap_demos"]}


def starting_resources(agent: str) -> tuple[dict[str, Any], str]:
    """The agent's prompts as the search starts from them (what it runs with by default), and the one rewritten."""
    if agent == "calc":
        from examples.calc_agent.prompts import SYSTEM_MESSAGE

        return {"system_prompt": SYSTEM_MESSAGE, "few_shot": []}, "system_prompt"
    from examples.sql_agent.prompts import DEFAULT_RESOURCES, WRITER_SYSTEM_RESOURCE

    return dict(DEFAULT_RESOURCES), WRITER_SYSTEM_RESOURCE


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.prompt_optimization",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--agent", choices=sorted(AGENTS), required=True)
    p.add_argument("--arm", choices=sorted(ARMS), help="required unless --report")
    p.add_argument("--report", action="store_true", help="print the table of the agent's results files and stop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=4, help="training tasks per step")
    p.add_argument("--n-rollouts", type=int, default=2, help="rollouts per training task")
    p.add_argument("--val-batch-size", type=int, default=8, help="val tasks each candidate is scored on")
    p.add_argument("--beam-width", type=int, default=2)
    p.add_argument("--candidates-per-step", type=int, default=2, help="new candidates per method per step")
    p.add_argument("--max-demos", type=int, default=3)
    p.add_argument("--optimizer-url", help="an OpenAI-compatible endpoint for the textual gradients (default: SmolLM2)")
    p.add_argument("--optimizer-model", help="its model name")
    p.add_argument("--optimizer-key-env", help="the environment variable holding its key")
    p.add_argument("--eval-limit", type=int, help="evaluate on the first N test tasks only (smoke runs)")
    p.add_argument(
        "--val-limit",
        type=int,
        help="the first N val tasks only: the pool candidates are scored from, and the "
        "trainer's evaluation after the last step (default: the whole val split)",
    )
    p.add_argument("--workdir", type=Path, help="default: runs/<agent>-agent/apo-<arm>-seed<N>")
    p.add_argument("--results", type=Path, help="default: examples/<agent>_agent/results")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming the workdir")
    return p


def apo_settings(args: argparse.Namespace, resource: str) -> dict[str, Any]:
    """The ``apo`` backend's config of the arm."""
    settings: dict[str, Any] = {
        "methods": ARMS[args.arm],
        "resource": resource,
        "demos_resource": "few_shot",
        "beam_width": args.beam_width,
        "candidates_per_step": args.candidates_per_step,
        "val_batch_size": args.val_batch_size,
        "max_demos": args.max_demos,
        "seed": args.seed,
    }
    if "textual_gradient" in settings["methods"]:
        if args.optimizer_url:
            optimizer = {"base_url": args.optimizer_url, "model": args.optimizer_model}
            if args.optimizer_key_env:
                optimizer["api_key_env"] = args.optimizer_key_env
        else:
            optimizer = {"engine": True, "max_tokens": 256}
        settings["optimizer"] = optimizer
    return settings


def run_config(args: argparse.Namespace, spec: Any, workdir: Path, model_path: Path) -> dict[str, Any]:
    """The example's own trainer config (engine, sampling, caps, credit), with the apo backend in place of verl."""
    resources, resource = starting_resources(args.agent)
    config_module = spec.part("config")
    run = dict(seed=args.seed, workdir=workdir, model_path=model_path, steps=args.steps)
    run.update(batch_size=args.batch_size, n_rollouts=args.n_rollouts)
    if args.agent == "calc":
        config = config_module.trainer_config(**run)
    else:  # the writer's calls only, each given the episode's reward
        config = config_module.trainer_config("broadcast", **run)
    config["backend"] = {"name": "apo", "config": apo_settings(args, resource)}
    config["resources"] = resources
    config["val_before"] = False  # the val split is the search's; before and after are measured on test
    config["val_max_tasks"] = args.val_limit
    config["progress"] = sys.stderr.isatty()
    config["plot"] = False
    return config


def evaluate_test(spec: Any, args: argparse.Namespace, test: list[dict], workdir: Path, resources: dict | None) -> dict:
    """The agent on the test split, greedily, with ``resources`` (None: its own prompts)."""
    from agl_verl.models import smollm2_dir

    cap = spec.defaults["max_response_tokens"]
    return spec.run_split(test, model_path=smollm2_dir(), workdir=workdir, max_response_tokens=cap, resources=resources)


def before_figures(spec: Any, args: argparse.Namespace, test: list[dict], workdir: Path) -> dict[str, Any]:
    """The base figures on test: the shared file when the whole split is evaluated; for the first N
    tasks, their success read from the shared file's ``solved`` list (the same greedy evaluation,
    every question's result kept); else evaluated here."""
    from examples.baseline import shared_base

    cap = spec.defaults["max_response_tokens"]
    base = HERE / spec.name / "results" / "base" / "test.json"
    if args.eval_limit is None:
        return shared_base(
            base,
            lambda: evaluate_test(spec, args, test, workdir, None),
            n=len(test),
            split="test",
            max_response_tokens=cap,
        )
    shared = json.loads(base.read_text()) if base.exists() else {}
    if "solved" in shared and shared.get("max_response_tokens") == cap and shared.get("n", 0) >= len(test):
        solved = set(shared["solved"]) & {t["task_id"] for t in test}
        source = str(base.relative_to(HERE.parent))
        return {"n": len(test), "success": len(solved) / len(test), "solved": sorted(solved), "source": source}
    return evaluate_test(spec, args, test, workdir, None)


def search_record(workdir: Path) -> dict[str, Any]:
    """What the search did, step by step, and the resources it ended with (the last checkpoint's beam)."""
    state = json.loads((workdir / "trainer_state.json").read_text())
    beam = json.loads((Path(state["checkpoint"]) / "apo_state.json").read_text())["beam"]
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if r.get("kind") == "train"]
    keys = ("reward_mean", "apo/best_score", "apo/parent_score", "apo/changed", "apo/candidates", "apo/exchanges")
    failures = ("apo/optimizer_calls", "apo/optimizer_errors", "apo/optimizer_unfenced", "apo/optimizer_discarded")
    return {
        "run_id": state["run_id"],
        "steps_completed": state["completed_step"],
        "by_step": [{k: r.get(k, 0.0) for k in ("step", *keys, *failures)} for r in steps],
        "resources_version": beam[0]["version"],
        "resources": beam[0]["resources"],
        "val_batch_score": beam[0]["score"],
        "beam": [{"version": c["version"], "method": c["method"], "score": c["score"]} for c in beam],
    }


def summary(results: Path) -> str:
    """A markdown table per arm: test success before and after, mean ± std over its seeds, then every seed's."""
    from examples.reporting import pm

    arms: dict[str, list[dict]] = {}
    for path in sorted(results.glob("apo-*-seed*.json")):
        record = json.loads(path.read_text())
        arms.setdefault(record["arm"], []).append(record)
    rows = [
        "| arm | seeds | steps | test tasks | test success before (%) | after (%) | seeds whose prompt changed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in [a for a in ARMS if a in arms]:
        records = sorted(arms[arm], key=lambda r: r["seed"])
        after = [r["after"]["success"] for r in records]
        every = ", ".join(f"{100 * a:.1f}" for a in after)
        changed = sum(r["resources_version"] != "r0" for r in records)
        rows.append(
            f"| {arm} | {', '.join(str(r['seed']) for r in records)} | {records[0]['steps']} | "
            f"{records[0]['eval_tasks']} | {pm([r['before']['success'] for r in records], 100)} | "
            f"{pm(after, 100)} ({every}) | {changed} of {len(records)} |"
        )
    return "\n".join(rows)


def report(results: Path) -> str:
    """A markdown table of the results files in ``results``: each arm and seed, test before and after."""
    rows = [
        "| arm | seed | test success before | after | val-batch score of the best | its version | optimizer calls "
        "(failed, unfenced, discarded) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(results.glob("apo-*-seed*.json")):
        r = json.loads(path.read_text())
        calls = [sum(s.get(f"apo/optimizer_{k}", 0) for s in r["by_step"]) for k in ("calls", "errors", "unfenced")]
        discarded = sum(s.get("apo/optimizer_discarded", 0) for s in r["by_step"])
        rows.append(
            f"| {r['arm']} | {r['seed']} | {r['before']['success']:.3f} | {r['after']['success']:.3f} | "
            f"{r['val_batch_score']:.3f} | {r['resources_version']} | {calls[0]:.0f} ({calls[1]:.0f}, {calls[2]:.0f}, "
            f"{discarded:.0f}) |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.report:
        results = args.results or HERE / AGENTS[args.agent].rsplit(".", 1)[1] / "results"
        print(summary(results) + "\n\n" + report(results))
        return 0
    if args.arm is None:
        p.error("--arm: required to run (one of demos, textual, both)")
    started = time.monotonic()
    import importlib

    import torch

    from agl_trainer import Trainer
    from agl_verl.models import smollm2_dir

    torch.set_num_threads(args.threads)
    spec = importlib.import_module(f"{AGENTS[args.agent]}.spec").SPEC
    name = f"apo-{args.arm}"
    workdir = (args.workdir or Path("runs") / spec.runs / f"{name}-seed{args.seed}").resolve()
    if args.fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec.register_reward()
    train = spec.subset.select(spec.load_split("train"), tuple(spec.subset.default))
    val, test = spec.load_split("val"), spec.load_split("test")[: args.eval_limit]
    config = run_config(args, spec, workdir, smollm2_dir())
    before = before_figures(spec, args, test, workdir / "test-before")
    Trainer(config).fit(spec.agent, train_tasks=train, val_tasks=val)
    search = search_record(workdir)
    after = evaluate_test(spec, args, test, workdir / "test-after", search["resources"])
    record = {
        "agent": args.agent,
        "arm": args.arm,
        "seed": args.seed,
        "methods": ARMS[args.arm],
        "optimizer": config["backend"]["config"].get("optimizer"),
        **{k: getattr(args, k) for k in ("steps", "batch_size", "n_rollouts", "val_batch_size", "beam_width")},
        "candidates_per_step": args.candidates_per_step,
        "eval_split": "test",
        "eval_tasks": len(test),
        "before": before,
        "after": after,
        "resources_before": config["resources"],
        **search,
        "wall_s": round(time.monotonic() - started, 1),
        "workdir": repo_relative(workdir),
        "commit": commit_of(REPO),
    }
    results = args.results or HERE / spec.name / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{name}-seed{args.seed}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    b, a = before[spec.score], after[spec.score]
    print(f"{args.agent} {name} seed {args.seed}: test {spec.score} {b:.3f} -> {a:.3f}; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
