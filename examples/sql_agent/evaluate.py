"""Evaluate the base model, or a trained LoRA adapter, on a split (greedy, one run per question).

    python examples/sql_agent/evaluate.py [--checkpoint DIR] [--split test|val|train] [--limit N] [--out FILE]

``--checkpoint`` is an adapter directory (``<workdir>/verl/versions/step-N``) or a
training work directory (its latest published version is used). Prints success per
tier, rewrite rounds, the checker's acceptance rate and LLM calls per agent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sql_agent.config import MAX_RESPONSE_TOKENS  # noqa: E402
from sql_agent.database import DB_ENV, db_path  # noqa: E402
from sql_agent.evaluation import run_split, timed  # noqa: E402
from sql_agent.questions import load_split  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and print (and optionally write) its summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="LoRA adapter or training workdir (default: the base model)")
    parser.add_argument("--split", choices=["train", "val", "test"], default="test")
    parser.add_argument("--limit", type=int, help="only the first N questions of the split")
    parser.add_argument(
        "--workdir", type=Path, help="where the evaluation's store goes (default: runs/sql-agent/eval-*)"
    )
    parser.add_argument("--out", type=Path, help="also write the summary here (JSON)")
    parser.add_argument("--db", help=f"Chinook.db (default: ${DB_ENV} or ../shared/data/chinook/Chinook.db)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--concurrency", type=int, default=16, help="questions at once")
    args = parser.parse_args(argv)

    if args.db:
        os.environ[DB_ENV] = str(Path(args.db).resolve())
    db_path()  # no database, no rewards: say so now, not as a run of zeros
    import torch

    from agl.errors import ConfigError
    from agl_verl.models import checkpoint_dir, smollm2_dir

    torch.set_num_threads(args.threads)
    try:
        adapter = checkpoint_dir(args.checkpoint.resolve()) if args.checkpoint else None
    except ConfigError as exc:
        parser.error(str(exc))
    items = load_split(args.split)[: args.limit]
    label = f"{args.split}-{adapter.parent.parent.parent.name + '-' + adapter.name if adapter else 'base'}"
    workdir = args.workdir or Path("runs") / "sql-agent" / f"eval-{label}"
    summary, seconds = timed(
        run_split,
        items,
        model_path=smollm2_dir(),
        adapter=adapter,
        workdir=workdir,
        split=args.split,
        concurrency=args.concurrency,
        max_response_tokens=MAX_RESPONSE_TOKENS,
    )
    summary.update({"split": args.split, "checkpoint": str(adapter) if adapter else None, "wall_s": round(seconds, 1)})
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
