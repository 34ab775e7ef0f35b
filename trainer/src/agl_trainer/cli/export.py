"""``agl export transitions``: transitions as JSONL or Parquet, for SFT or offline use."""

from __future__ import annotations

import argparse
import sys

from agl_trainer.cli._common import add_store_client_arguments, open_for_command


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="export training data from a store")
    sub = p.add_subparsers(dest="export_command", metavar="WHAT", required=True)
    t = sub.add_parser("transitions", help="transitions (text and token ids) of ended rollouts")
    add_store_client_arguments(t)
    t.add_argument("--step", type=int, default=None, help="only rollouts of this training step")
    t.add_argument("--mode", choices=["train", "val", "production"], default=None, help="only rollouts of this mode")
    t.add_argument("--format", choices=["jsonl", "parquet"], default=None, help="default: from the file name")
    t.add_argument("--agent", action="append", default=None, help="only this agent's calls (repeat for several)")
    t.add_argument("--credit", default="broadcast", help="credit-assignment strategy (default broadcast)")
    t.add_argument(
        "--missing-reward",
        type=float,
        default=None,
        help="reward for succeeded rollouts nobody rewarded, e.g. 0 for agl run captures "
        "(default: leave them out, counted on stderr)",
    )
    t.add_argument("--no-text-only", action="store_true", help="leave out text-only transitions")
    t.add_argument("-o", "--output", required=True, help="the file to write")
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``agl export transitions``: write the file, then say on stderr how calls and spans joined,
    what was left out and why."""
    from agl.store.base import default_store_url
    from agl_trainer.export import drop_notes, export_transitions, format_for
    from agl_trainer.transitions import TransitionConfig

    fmt = format_for(args.output, args.format)
    config = TransitionConfig(
        credit=args.credit, agents=args.agent, missing_reward=args.missing_reward, text_only=not args.no_text_only
    )
    url = args.store or default_store_url()
    store = open_for_command(args, url)
    try:
        n, report = export_transitions(store, args.output, step=args.step, mode=args.mode, format=fmt, config=config)
    finally:
        store.close()
    print(f"agl export: {n} transitions from {report.rollouts} rollouts to {args.output} ({fmt})", file=sys.stderr)
    print(f"agl export: {report.joins()}", file=sys.stderr)
    if report.rollouts_without_spans:
        print(
            f"agl export: {report.rollouts_without_spans} rollouts had gateway calls and no LLM span joined "
            f"(e.g. {report.without_spans[0]}): where capture was on for them it recorded nothing",
            file=sys.stderr,
        )
    for note in drop_notes(report):
        print(f"agl export: {note}", file=sys.stderr)
    return 0
