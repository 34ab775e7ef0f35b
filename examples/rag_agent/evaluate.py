"""Evaluate the base model, or a trained LoRA adapter, on a split (greedy, one run per question).

    python examples/rag_agent/evaluate.py [--checkpoint DIR] [--split test|val|train] [--limit N] [--out FILE]
    python examples/rag_agent/evaluate.py --split val --temperature 1 --samples 4 [--hops 1]

``--checkpoint`` is an adapter directory (``<workdir>/verl/versions/step-N``) or a
training work directory (its latest published version is used). Prints token F1 and
exact match (overall and by hops), how episodes ended, tool calls per episode and the
tool-call validity rate. ``--samples K`` at a ``--temperature`` runs each question K
times and adds the fraction of questions whose samples' F1 differ: those a GRPO group of
K would learn from.
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

from sampling import add_sampling_arguments, check_sampling_arguments, evaluation_facts  # noqa: E402

from rag_agent.config import MAX_RESPONSE_TOKENS  # noqa: E402
from rag_agent.evaluation import run_split  # noqa: E402
from rag_agent.questions import load_split, of_hops  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and print (and optionally write) its summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="LoRA adapter or training workdir (default: the base model)")
    parser.add_argument("--split", choices=["train", "val", "test"], default="test")
    parser.add_argument("--limit", type=int, help="only the first N questions of the split")
    parser.add_argument("--hops", type=int, nargs="+", help="only questions of these numbers of hops (1, 2)")
    parser.add_argument("--workdir", type=Path, help="the evaluation store (default: runs/rag-agent/eval-*)")
    parser.add_argument("--out", type=Path, help="also write the summary here (JSON)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--concurrency", type=int, default=16, help="questions at once")
    parser.add_argument("--max-response-tokens", type=int, default=MAX_RESPONSE_TOKENS)
    add_sampling_arguments(parser)
    args = parser.parse_args(argv)
    check_sampling_arguments(parser, args)

    import torch

    from agl.errors import ConfigError
    from agl_verl.models import checkpoint_dir, smollm2_dir

    torch.set_num_threads(args.threads)
    try:
        adapter = checkpoint_dir(args.checkpoint.resolve()) if args.checkpoint else None
    except ConfigError as exc:
        parser.error(str(exc))
    items = load_split(args.split)
    if args.hops:
        try:
            items = of_hops(items, tuple(args.hops))
        except ValueError as exc:
            parser.error(f"--{exc}")
    items = items[: args.limit]
    label = f"{args.split}-{adapter.parent.parent.parent.name + '-' + adapter.name if adapter else 'base'}"
    workdir = args.workdir or Path("runs") / "rag-agent" / f"eval-{label}"
    started = time.monotonic()
    summary = run_split(
        items,
        model_path=smollm2_dir(),
        adapter=adapter,
        workdir=workdir,
        split=args.split,
        concurrency=args.concurrency,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
        samples=args.samples,
    )
    summary.update(evaluation_facts(args, adapter, started), hops=args.hops)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
