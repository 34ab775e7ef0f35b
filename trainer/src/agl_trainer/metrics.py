"""Training metrics: what a step measured, where it goes, and the end-of-run report.

- :func:`step_metrics` turns a step's rollouts, transitions and timings into numbers;
- :class:`MetricsLog` appends them to ``metrics.jsonl`` (one JSON object a line);
- :func:`console_line` is the one-line summary printed per step;
- :func:`plot_reward_curve` draws ``reward_curve.png`` (matplotlib, imported only here);
- :func:`before_after` compares held-out evaluations before and after training.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agl.schema import Rollout, RolloutStatus, Transition


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (0, 0 for no values)."""
    if not values:
        return 0.0, 0.0
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def reward_metrics(
    finals: dict[str, float], rollouts: Iterable[Rollout], success_threshold: float, prefix: str = ""
) -> dict[str, float]:
    """Reward mean/std, success rate and outcome counts over rollouts (a rollout with no final reward counts as 0)."""
    rollouts = list(rollouts)
    values = [finals.get(r.rollout_id, 0.0) for r in rollouts]
    m, s = mean_std(values)
    out = {
        f"{prefix}reward_mean": m,
        f"{prefix}reward_std": s,
        f"{prefix}reward_min": min(values, default=0.0),
        f"{prefix}reward_max": max(values, default=0.0),
        f"{prefix}success_rate": (sum(v >= success_threshold for v in values) / len(values)) if values else 0.0,
        f"{prefix}rollouts": float(len(rollouts)),
    }
    for status in (RolloutStatus.FAILED, RolloutStatus.TIMED_OUT, RolloutStatus.CANCELLED):
        out[f"{prefix}rollouts_{status.value}"] = float(sum(r.status == status for r in rollouts))
    return out


def transition_metrics(
    transitions: Sequence[Transition], staleness: Sequence[int], update_s: float
) -> dict[str, float]:
    """Sizes (``learner_tokens``: the prompt and response tokens of all rows), training tokens/s and
    staleness (``staleness``: each transition's versions behind its learner)."""
    if not transitions:
        return {"transitions": 0.0}
    response = [len(t.response_ids) for t in transitions]
    prompt = [len(t.prompt_ids) for t in transitions]
    tokens = sum(response) + sum(prompt)
    return {
        "transitions": float(len(transitions)),
        "learner_tokens": float(tokens),
        "response_length_mean": sum(response) / len(response),
        "response_length_max": float(max(response)),
        "prompt_length_mean": sum(prompt) / len(prompt),
        "tokens_per_s": tokens / update_s if update_s > 0 else 0.0,
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": float(max(staleness)),
    }


class MetricsLog:
    """``metrics.jsonl`` in a workdir: one record per step (and per evaluation).

    Given a ``store`` and ``run_id``, each record also goes into the store
    (:meth:`agl.store.base.Store.add_step_record`), where the dashboard's runs page reads
    it while training runs; a store that refuses it costs one warning, never the run.
    """

    def __init__(self, path: str | Path, store: Any = None, run_id: str | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.store = store if run_id else None
        self.run_id = run_id
        self._warned = False

    def append(self, record: dict[str, Any]) -> None:
        """Append one record and make it durable (then hand it to the store, if any)."""
        with open(self.path, "a") as f:
            f.write(json.dumps(record, allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.keep_in_store(record)

    def keep_in_store(self, record: dict[str, Any]) -> None:
        """Hand a record to the store only (as :meth:`append` does after writing the file); a
        failure is one warning for the whole run."""
        if self.store is None:
            return
        try:
            self.store.add_step_record(self.run_id, record)
        except Exception as exc:
            if not self._warned:
                logging.getLogger(__name__).warning("step records not kept in the store (%s): %s", self.store, exc)
                self._warned = True

    def read(self) -> list[dict[str, Any]]:
        """Every record, oldest first (a torn last line from a crash is skipped)."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (work of a step that did not complete before a crash)."""
        keep = [r for r in self.read() if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in keep))
        os.replace(tmp, self.path)


def _number(value: float) -> str:
    """A loss-like value with digits to read: 0.0123, 1.2e-05, 0 (never ``-0.0000``)."""
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.4f}"
    return f"{value:.2e}"


# (record key, label, format): the optional fields of a step line, most telling first.
_LINE_FIELDS: list[tuple[str, str, Callable[[float], str]]] = [
    ("val_reward_mean", "val", "{:.3f}".format),
    ("loss", "loss", _number),
    ("kl", "kl", _number),
    ("entropy", "entropy", "{:.3f}".format),
    ("transitions", "trans", lambda v: str(round(v))),
    ("response_length_mean", "resp", "{:.1f}".format),
    ("tokens_per_s", "tok/s", lambda v: str(round(v))),
    ("staleness_mean", "stale", "{:.2f}".format),
    ("filter_groups/gen_batches", "batches", lambda v: str(round(v))),
    ("filter_groups/groups_dropped", "dropped", lambda v: str(round(v))),
]


def console_line(record: dict[str, Any], total_steps: int, width: int | None = None) -> str:
    """``step 3/20  reward 0.410±0.120  success 38%  loss 0.0123 …`` for one step's record.

    With ``width``, fields are dropped from the end (the time breakdown first) until
    the line fits; step, reward and success always stay.
    """
    head = [f"step {record['step']}/{total_steps}"]
    if "reward_mean" in record:
        head.append(f"reward {record['reward_mean']:.3f}±{record.get('reward_std', 0):.3f}")
        head.append(f"success {100 * record.get('success_rate', 0):.0f}%")
    fields = [
        f"{label} {fmt(record[key])}"
        for key, label, fmt in _LINE_FIELDS
        if key in record and isinstance(record[key], (int, float))
    ]
    phases = [
        f"{k[5:-2]} {record[k]:.1f}s"
        for k in ("time_rollout_s", "time_transitions_s", "time_update_s", "time_publish_s", "time_val_s")
        if k in record
    ]
    if phases:
        fields.append("(" + ", ".join(phases) + ")")
    line = "  ".join(head + fields)
    while width is not None and len(line) > width and fields:
        fields.pop()
        line = "  ".join(head + fields)
    return line


def plot_reward_curve(records: Sequence[dict[str, Any]], path: str | Path) -> Path | None:
    """Draw training reward per step (±std, clipped to the rewards seen) and validation reward.

    Uses a matplotlib ``Figure`` with its own Agg canvas, so the plotting backend of the
    process is left alone. None when matplotlib is missing.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    train = [r for r in records if r.get("kind") == "train" and "reward_mean" in r]
    val = [r for r in records if "val_reward_mean" in r]
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train:
        xs = [r["step"] for r in train]
        ys = [r["reward_mean"] for r in train]
        sd = [r.get("reward_std", 0.0) for r in train]
        lo = min(r.get("reward_min", r["reward_mean"]) for r in train)
        hi = max(r.get("reward_max", r["reward_mean"]) for r in train)
        ax.plot(xs, ys, marker="o", label="train reward (mean)")
        ax.fill_between(
            xs,
            [max(y - s, lo) for y, s in zip(ys, sd, strict=True)],
            [min(y + s, hi) for y, s in zip(ys, sd, strict=True)],
            alpha=0.2,
            label="±1 std (within the rewards seen)",
        )
    if val:
        ax.plot([r["step"] for r in val], [r["val_reward_mean"] for r in val], marker="s", label="val reward (mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("agl training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def before_after(before: dict[str, float] | None, after: dict[str, float] | None) -> list[tuple[str, str, str, str]]:
    """Rows ``(metric, before, after, change)`` for the held-out evaluation; counts as whole numbers."""
    rows = []
    for key, label, count in [
        ("val_reward_mean", "reward (mean)", False),
        ("val_reward_std", "reward (std)", False),
        ("val_success_rate", "success rate", False),
        ("val_rollouts", "rollouts", True),
        ("val_rollouts_failed", "failed", True),
        ("val_rollouts_timed_out", "timed out", True),
    ]:
        b = None if before is None else before.get(key)
        a = None if after is None else after.get(key)
        if b is None and a is None:
            continue
        change = _shown(a - b, count, "+") if a is not None and b is not None else ""
        rows.append((label, _shown(b, count), _shown(a, count), change))
    return rows


def _shown(value: float | None, count: bool, sign: str = "") -> str:
    if value is None:
        return ""
    return f"{round(value):{sign}d}" if count else f"{value:{sign}.3f}"


def before_after_markdown(rows: list[tuple[str, str, str, str]]) -> str:
    """The before/after rows as a Markdown table."""
    lines = ["| held-out | before | after | change |", "|---|---:|---:|---:|"]
    lines += [f"| {m} | {b} | {a} | {c} |" for m, b, a, c in rows]
    return "\n".join(lines) + "\n"


def print_before_after(rows: list[tuple[str, str, str, str]], console: Any = None) -> None:
    """Print the before/after rows as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table("held-out", "before", "after", "change", title="before / after training")
    for row in rows:
        table.add_row(*row)
    (console or Console()).print(table)


__all__ = [
    "MetricsLog",
    "before_after",
    "before_after_markdown",
    "console_line",
    "mean_std",
    "plot_reward_curve",
    "print_before_after",
    "reward_metrics",
    "transition_metrics",
]
