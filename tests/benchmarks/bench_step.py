"""A training step against its measured-parts floor, on recorded steps of the examples.

    python -m tests.benchmarks.bench_step [--agent calc_agent] [--step 1 3] [--cache-mb MB]
    python -m tests.benchmarks.bench_step --record calc_agent --steps 3

Replay (default) takes each committed fixture (``tests/benchmarks/data/steps``, written by
``--record``: :mod:`tests.benchmarks.step_fixtures`) and measures, with the prefix cache
(``--cache-mb``) and without it (``prefix_cache_mb=0``, the baseline), in this process:

1. **engine alone**: a fresh transformers engine on SmolLM2-135M-Instruct; the step's
   rollouts replayed over loopback HTTP (``/v1/completions``, the prompt as token ids,
   ``max_tokens`` = the recorded response's length with ``ignore_eos``, so the work is
   the same), ``--concurrency`` rollouts at once, each rollout's calls in order. The
   engine's counters give the prompt tokens computed and cached.
2. **update alone** (once a fixture): the examples' verl learner (``examples/learner.py``)
   ``train_step`` on the step's recorded transitions.
3. **step**: both in one process as the synchronous trainer has them: the engine started,
   the learner set up (the trainer's order), the rollouts replayed, then the update. Its
   floor is 1 + 2.

``--device auto`` (the default) runs both on the GPU in bfloat16 where torch sees one, else on
the CPU in float32; ``--model llama-1b`` replaces SmolLM2 by a 1B-parameter Llama of random
weights on SmolLM2's tokenizer (nothing is downloaded), for timings on a GPU.

The replay leaves out the agents' own work and the gateway; the recorded step's wall time
(``time_step_s`` of the run) is printed against the same floor for reference.
``--record AGENT --steps K`` trains the example K steps from its own config (seed
``--seed``, no test-split evaluation) and writes one fixture a step.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import agl_verl  # noqa: E402, F401 - its OpenMP wait policy (agl_verl.threads), set before torch loads
from tests.benchmarks.step_replay import Setup  # noqa: E402 - after the offline switch; no torch yet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--record", metavar="AGENT", help="record fixtures of this example instead of replaying")
    parser.add_argument("--steps", type=int, default=3, help="steps to record")
    parser.add_argument("--seed", type=int, default=0, help="the recorded run's seed")
    parser.add_argument("--agent", help="replay this agent's fixtures only (default: all)")
    parser.add_argument("--step", type=int, nargs="+", help="replay these steps only (default: every fixture)")
    parser.add_argument(
        "--cache-mb", type=float, help="the prefix cache measured against 0 (default: the engine's default)"
    )
    parser.add_argument(
        "--no-baseline-step",
        action="store_true",
        help="time the step with the cache only (the baseline's engine still)",
    )
    parser.add_argument("--concurrency", type=int, help="rollouts at once (default: the recorded run's)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (the examples' default)")
    Setup.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.record:
        from tests.benchmarks.step_recording import record

        for path in record(args.record, args.steps, args.seed):
            print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
        return 0
    from tests.benchmarks.step_replay import replay_all

    return replay_all(args)


if __name__ == "__main__":
    sys.exit(main())
