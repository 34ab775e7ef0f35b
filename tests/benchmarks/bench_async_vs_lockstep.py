"""Wall time per training step, lockstep (``max_staleness: 0``) against asynchronous (``max_staleness: 1``).

The calculator example (``examples.calc_agent.train``) trains the same seed with the same
settings in both arms; only ``--max-staleness`` differs. The arms run in turns, round after
round, each run a fresh process with a fresh work directory, and the first arm of a round
alternates (lockstep first in even rounds), so a machine whose load drifts weighs on both
alike. ``/proc/loadavg`` is read before and after every run and printed beside its times:
figures from a loaded machine say so.

A step's time is the trainer's ``time_step_s`` (from the step's start, waiting for its
rollouts included, to its adapter published): asynchronous steps gain where the next step's
rollouts ran while this one trained. The ratio that counts is over all steps (a run's training
time over its steps); the summary also gives steps 2 and later ("steady": step 1 has nothing run
ahead of it in either arm, but the last asynchronous step finds its rollouts done already, so
this one flatters the asynchronous arm).

    .venv/bin/python -m tests.benchmarks.bench_async_vs_lockstep [--rounds 3] [--steps 4] [--model smollm2]

The default model is the tiny random llama of the calculator's tests (fast; it never solves a
problem, so the updates are of zero-advantage batches); ``--model smollm2`` trains the bundled
SmolLM2-135M-Instruct as the example does (a step is about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARMS = {"lockstep": 0, "async": 1}
"""Each arm's ``--max-staleness``."""


def loadavg() -> str:
    """The 1-, 5- and 15-minute load averages (``/proc/loadavg``), or ``n/a`` where there is none."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def tiny_model(folder: Path) -> Path:
    """The calculator tests' tiny random llama (a tokenizer trained on the example's own text)."""
    import examples.calc_agent as example
    import examples.calc_agent.problems
    import examples.calc_agent.prompts  # noqa: F401 - the attributes tiny_model reads
    from tests.examples.test_calc_agent import tiny_model as build

    return build(example, folder)


def train_command(args: argparse.Namespace, staleness: int, workdir: Path, model: Path | None) -> list[str]:
    """One run of the example: the same seed and settings in both arms but ``--max-staleness``."""
    argv = [sys.executable, "-m", "examples.calc_agent.train", "--seed", str(args.seed), "--steps", str(args.steps)]
    argv += ["--batch-size", str(args.batch_size), "--n-rollouts", str(args.n_rollouts)]
    argv += ["--max-response-tokens", str(args.max_response_tokens), "--threads", str(args.threads)]
    argv += ["--max-staleness", str(staleness), "--eval-limit", "1", "--before", "run", "--fresh"]
    argv += ["--workdir", str(workdir), "--results", str(workdir / "results")]
    return argv + (["--model", str(model)] if model else [])


def step_times(workdir: Path) -> list[float]:
    """The run's ``time_step_s`` per training step, in step order."""
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["time_step_s"] for r in sorted(records, key=lambda r: r["step"]) if r.get("kind") == "train"]


def run_arm(args: argparse.Namespace, arm: str, round_: int, scratch: Path, model: Path | None) -> dict:
    """One fresh run of ``arm``: its step times, wall time and the load before and after."""
    workdir = scratch / f"{arm}-round{round_}"
    before = loadavg()
    started = time.monotonic()
    log = workdir.with_suffix(".log")
    with log.open("w") as out:
        code = subprocess.call(
            train_command(args, ARMS[arm], workdir, model), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    wall = time.monotonic() - started
    if code:
        raise SystemExit(f"{arm} round {round_} exited {code}; its log: {log}\n{log.read_text()[-2000:]}")
    times = step_times(workdir)
    run = {"arm": arm, "round": round_, "steps": times, "wall_s": wall, "load_before": before, "load_after": loadavg()}
    shown = " ".join(f"{t:.2f}" for t in times)
    print(
        f"round {round_} {arm:8s} step s [{shown}]  process wall {wall:.1f} s  "
        f"load before {run['load_before']}  after {run['load_after']}",
        flush=True,
    )
    return run


def mean_std(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def summary(runs: list[dict]) -> None:
    """Each arm's step time (steady: steps 2 and later; all steps), and asynchronous over lockstep."""
    steady = {arm: [t for r in runs if r["arm"] == arm for t in r["steps"][1:]] for arm in ARMS}
    every = {arm: [t for r in runs if r["arm"] == arm for t in r["steps"]] for arm in ARMS}
    print("\narm       steady step s (steps 2..)  all steps s      runs")
    for arm in ARMS:
        n = sum(r["arm"] == arm for r in runs)
        print(f"{arm:9s} {mean_std(steady[arm]):26s} {mean_std(every[arm]):16s} {n}")
    print()
    for name, series, first in (("all steps", every, 0), ("steady step time", steady, 1)):
        if not all(series.values()):
            continue
        ratio = statistics.fmean(series["async"]) / statistics.fmean(series["lockstep"])
        per_round = []
        for round_ in sorted({r["round"] for r in runs}):
            pair = {r["arm"]: statistics.fmean(r["steps"][first:]) for r in runs if r["round"] == round_}
            if len(pair) == 2:
                per_round.append(pair["async"] / pair["lockstep"])
        print(f"async / lockstep, {name}: {ratio:.3f} (per round: {', '.join(f'{x:.3f}' for x in per_round)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs both arms once")
    parser.add_argument("--steps", type=int, default=4, help="training steps of each run")
    parser.add_argument("--batch-size", type=int, default=3, help="problems per step")
    parser.add_argument("--n-rollouts", type=int, default=4, help="rollouts per problem")
    parser.add_argument("--max-response-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of each run")
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--keep", type=Path, help="keep the runs' work directories here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: step 1 has nothing run ahead of it in either arm")
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        model = tiny_model(scratch / "tiny") if args.model == "tiny" else None
        print(
            f"calc_agent, model {args.model}: {args.steps} steps of {args.batch_size} problems x {args.n_rollouts} "
            f"rollouts, {args.max_response_tokens} response tokens, {args.threads} torch threads; {args.rounds} "
            f"rounds; load at start {loadavg()}",
            flush=True,
        )
        runs = []
        for round_ in range(args.rounds):
            order = list(ARMS) if round_ % 2 == 0 else list(reversed(ARMS))
            runs += [run_arm(args, arm, round_, scratch, model) for arm in order]
        summary(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
