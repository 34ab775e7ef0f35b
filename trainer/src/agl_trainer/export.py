"""Exporting transitions for SFT or offline RL: JSONL or Parquet, text and token ids.

Each row is one transition: ``rollout_id``, ``task_id``, ``rollout_step`` (the
training step that enqueued the rollout), ``call_index`` (position of the call in
its rollout), ``agent``, ``token_source`` (``engine`` or ``text``), ``call_id``,
``model_version``, ``reward`` (after credit assignment), ``weight``,
``prompt_ids``, ``response_ids``, ``response_logprobs`` (lists; empty / null for
text-only transitions), ``prompt_messages`` (JSON) and ``response_text``.

Rows stream out one chunk of rollouts at a time; ``pyarrow`` is imported only for
Parquet.

A succeeded rollout that nobody rewarded (no ``agl.emit_reward``, no ``agl_reward``
plugin: every ``agl run`` capture of an unmodified program) is left out unless
``TransitionConfig.missing_reward`` gives it a reward: a made-up reward would enter
offline RL data looking like a real one. :func:`drop_notes` says how many were left out
and which flag keeps them (``agl export transitions --missing-reward 0``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from agl.errors import ConfigError
from agl.schema import TERMINAL_STATUSES, Rollout, Transition
from agl.store.base import Store
from agl_trainer.transitions import BuildReport, TransitionBuilder, TransitionConfig

Format = Literal["jsonl", "parquet"]

COLUMNS = (
    "rollout_id",
    "task_id",
    "rollout_step",
    "call_index",
    "agent",
    "token_source",
    "call_id",
    "model_version",
    "reward",
    "weight",
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "prompt_messages",
    "response_text",
)


def transition_row(t: Transition, rollout_step: int | None) -> dict[str, Any]:
    """One transition as a plain row (lists of numbers, JSON-ready)."""
    return {
        "rollout_id": t.rollout_id,
        "task_id": t.task_id,
        "rollout_step": rollout_step,
        "call_index": t.step,
        "agent": t.agent,
        "token_source": t.token_source,
        "call_id": t.call_id,
        "model_version": t.model_version,
        "reward": t.reward,
        "weight": t.weight,
        "prompt_ids": t.prompt_ids.tolist(),
        "response_ids": t.response_ids.tolist(),
        "response_logprobs": None if t.response_logprobs is None else t.response_logprobs.tolist(),
        "prompt_messages": t.prompt_messages,
        "response_text": t.response_text,
    }


#: Why a build leaves a rollout out (``BuildReport.dropped_rollouts`` keys), for people.
DROP_REASONS = {
    "no_reward": (
        "succeeded but nobody rewarded them (no agl.emit_reward, no agl_reward plugin); "
        "--missing-reward 0 keeps them with reward 0"
    ),
    "no_calls": "no LLM call of theirs was recorded (by the gateway or a span)",
    "cancelled": "they were cancelled",
    "not_ended": "they have not ended",
}


def drop_notes(report: BuildReport) -> list[str]:
    """One line per reason rollouts were left out: how many, why, and the flag that keeps them where one does."""
    notes = []
    for reason, n in sorted(report.dropped_rollouts.items()):
        why = DROP_REASONS.get(reason, f"they {reason.replace('_', ' ')} and have no reward of their own")
        notes.append(f"left out {n} rollout{'s' if n != 1 else ''} ({reason}): {why}")
    return notes


def format_for(path: str | Path, format: str | None) -> Format:
    """The format asked for, or the one the file name says; a clear error otherwise."""
    if format is None:
        suffix = Path(path).suffix.lower()
        format = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}.get(suffix)
        if format is None:
            raise ConfigError(f"--format: cannot tell the format from {str(path)!r}; use --format jsonl or parquet")
    if format not in ("jsonl", "parquet"):
        raise ConfigError(f"--format: expected jsonl or parquet, got {format!r}")
    return format  # type: ignore[return-value]


def iter_rows(
    store: Store, rollouts: Iterable[Rollout], config: TransitionConfig, report_to: list[BuildReport]
) -> Iterator[dict]:
    """Rows of the transitions of ``rollouts`` (text filled in); the build's report is appended to ``report_to``."""
    builder = TransitionBuilder(store, config.model_copy(update={"with_text": True}))
    report_to.append(builder.report)
    steps: dict[str, int | None] = {}

    def remember(rs: Iterable[Rollout]) -> Iterator[Rollout]:
        for r in rs:
            steps[r.rollout_id] = r.step
            yield r

    for t in builder.iter(remember(rollouts)):
        yield transition_row(t, steps.get(t.rollout_id))


def export_transitions(
    store: Store,
    path: str | Path,
    *,
    step: int | None = None,
    mode: str | None = None,
    format: str | None = None,
    config: TransitionConfig | None = None,
    batch_rows: int = 1024,
) -> tuple[int, BuildReport]:
    """Write the transitions of ended rollouts (of one training ``step`` and ``mode`` if given) to ``path``.

    Returns how many rows were written and the build report (what was dropped and why).
    """
    fmt = format_for(path, format)
    config = config or TransitionConfig()
    if config.merge != "off":
        raise ConfigError(
            f"transitions.merge: {config.merge!r} makes training rows of several calls; an export has one row "
            "per call (call_index, reward, response_text of that call): export with merge 'off'"
        )
    rollouts = (
        r for r in store.query_rollouts(step=step, status=list(TERMINAL_STATUSES)) if mode is None or r.mode == mode
    )
    reports: list[BuildReport] = []
    rows = iter_rows(store, rollouts, config, reports)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = _write_jsonl(rows, path) if fmt == "jsonl" else _write_parquet(rows, path, batch_rows)
    return n, reports[0]


def _write_jsonl(rows: Iterator[dict], path: Path) -> int:
    n = 0
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n


def _write_parquet(rows: Iterator[dict], path: Path, batch_rows: int) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("--format parquet: needs pyarrow (pip install 'agl-core[parquet]')") from None
    schema = pa.schema(
        [
            ("rollout_id", pa.string()),
            ("task_id", pa.string()),
            ("rollout_step", pa.int64()),
            ("call_index", pa.int64()),
            ("agent", pa.string()),
            ("token_source", pa.string()),
            ("call_id", pa.string()),
            ("model_version", pa.string()),
            ("reward", pa.float64()),
            ("weight", pa.float64()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("response_logprobs", pa.list_(pa.float32())),
            ("prompt_messages", pa.string()),
            ("response_text", pa.string()),
        ]
    )
    n = 0
    tmp = path.with_name(path.name + ".part")
    with pq.ParquetWriter(tmp, schema) as writer:
        batch: list[dict] = []

        def flush() -> None:
            for row in batch:
                row["prompt_messages"] = None if row["prompt_messages"] is None else json.dumps(row["prompt_messages"])
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            batch.clear()

        for row in rows:
            batch.append(row)
            n += 1
            if len(batch) >= batch_rows:
                flush()
        if batch or n == 0:
            flush()
    tmp.replace(path)
    return n


__all__ = ["COLUMNS", "DROP_REASONS", "drop_notes", "export_transitions", "format_for", "transition_row"]
