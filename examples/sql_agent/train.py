"""Train the SQL agent (agent.py) with reinforcement learning, one arm and one seed.

SmolLM2-135M-Instruct with a LoRA adapter, trained on the easy tier (``--tiers``); the
test split keeps all three tiers (:mod:`examples.training`). The figures go to
``results/<arm>-seed<N>.json``; ``report.py`` builds the table of docs/results/sql-agent.md from those files.

    python -m examples.sql_agent.train --seed 0 [--arm main|broadcast|last|emitted|all-agents] [--steps N]
    python -m examples.sql_agent.train --seed 0 --arm main --refresh
"""

from __future__ import annotations

import json
from pathlib import Path

from examples.sql_agent.spec import SPEC
from examples.training import arm_name, collect, parse_train_args, train_metrics, train_parser, train_seed


def refresh(out: Path, test: list[dict], base_file: Path) -> dict:
    """Recompute a finished run's figures from its workdir's store with the current :func:`summarize`.

    For a results file written before a figure was added. The shared base figures in
    ``base_file`` are recomputed from the store the base evaluation left beside the run.
    """
    from agl.store.base import open_store

    record = json.loads(out.read_text())
    workdir = Path(record["workdir"])
    tasks = {t["task_id"]: t["input"] for t in test}
    figures = collect(SPEC, workdir, record["steps"], tasks)
    if record["before_source"] != "this run":
        base_store = workdir.parent / "base-test"
        store = open_store(f"sqlite:///{base_store / 'agl.db'}", create=False)
        try:
            rollouts = list(store.query_rollouts())
            if sorted(r.task_id for r in rollouts) != sorted(tasks):
                raise SystemExit(f"{base_store}: not one evaluation of these {len(tasks)} questions")
            base = SPEC.summarize(rollouts, tasks, store)
        finally:
            store.close()
        figures["before"] = {**json.loads(base_file.read_text()), **base}
        base_file.write_text(json.dumps(figures["before"], indent=1) + "\n")
    curve, metric = SPEC.curve
    record.update(figures, **{curve: [round(r.get(metric, 0.0), 4) for r in train_metrics(workdir)]})
    out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    """Train one arm with one seed and write its results file (or, with ``--refresh``, recompute it)."""
    parser = train_parser(SPEC, __doc__)
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="no training: recompute the figures of this arm and seed's results file from the store of its run",
    )
    args, train = parse_train_args(SPEC, argv, __doc__, parser)
    if not args.refresh:
        return train_seed(SPEC, args, train)
    name = f"{arm_name(SPEC, args)}-seed{args.seed}"
    test = SPEC.load_split("test")[: args.eval_limit]
    record = refresh(args.results / f"{name}.json", test, args.results / "base" / "test.json")
    print(f"{name}: test success {record['before']['success']:.3f} -> {record['after']['success']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
