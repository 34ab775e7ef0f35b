"""The Runs page's charts, drawn from a run's step records, whatever those records hold.

A step record is what the trainer stored after a step, but the store takes any JSON
object from whoever holds the admin token, so a value may be a string, a list or null
where a number belongs. Such a value is left out of the charts and listed under them
as it is (``step 3: reward_std = "abc"``); the page always renders. A run of several
policies gets a chart per policy metric (``policy/<name>/<metric>``) with a line per policy.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from agl_trainer.dashboard import charts
from agl_trainer.dashboard.html import e, number, seconds, when

STEP_TIMES = ("time_rollout_s", "time_transitions_s", "time_update_s", "time_publish_s", "time_val_s")
"""The step record's timings, stacked in the step-time chart."""
OFF_POLICY = "rollout_corr/"
"""The prefix of verl's off-policy metrics in a step record (see agl_verl.correction)."""
POLICY = "policy/"
"""The prefix of one policy's metrics in a step record of a run of several policies:
``policy/<name>/<metric>`` (a run of one policy keeps its metrics unprefixed)."""
POLICY_CHARTS = (
    ("reward_mean", "Reward (mean) per policy"),
    ("loss", "Loss per policy"),
    ("kl", "KL per policy"),
    ("entropy", "Entropy per policy"),
    ("grad_norm", "Grad norm per policy"),
    ("pg_clipfrac", "PG clip fraction per policy"),
)
"""The per-policy metrics charted, one line per policy that has the metric: ``(metric, title)``."""
POLICY_COUNTS = ("transitions", "calls")
"""A policy's counts, charted together: transitions it trained on, calls it served (a frozen policy)."""


class _Numbers:
    """Reads the numbers out of step records, noting each value that is not one (once)."""

    def __init__(self) -> None:
        self.bad: dict[str, None] = {}

    def get(self, record: dict[str, Any], key: str) -> float | None:
        """``record[key]`` as a float; None when absent or null, or (noted) when not a finite number."""
        value = record.get(key)
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        step = record.get("step")
        shown = json.dumps(value, default=str)
        self.bad[f"step {json.dumps(step, default=str)}: {key} = {shown[:80]}{'…' if len(shown) > 80 else ''}"] = None
        return None

    def points(self, records: list[dict], key: str, std: str | None = None) -> charts.Series:
        """The ``(step, record[key])`` points of ``records`` that have both, with ``std`` as the spread."""
        points, spread = [], []
        for record in records:
            step, value = self.get(record, "step"), self.get(record, key)
            if step is not None and value is not None:
                points.append((step, value))
                spread.append((self.get(record, std) or 0.0) if std else 0.0)
        return charts.Series(key, points, spread if std else None)


def _line(numbers: _Numbers, name: str, records: list[dict], key: str, std: str | None = None) -> charts.Series:
    series = numbers.points(records, key, std)
    series.name = name
    return series


def _shown(value: Any, format_number) -> str:
    """A summary value: formatted when it is a number, else written as it is stored."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format_number(value)
    return "" if value is None else json.dumps(value, default=str)[:80]


def run_charts(records: list[dict[str, Any]]) -> str:
    """The charts (and the last step's summary) of one run's step records, as HTML."""
    numbers = _Numbers()
    train = [r for r in records if r.get("kind") == "train"]
    val = [r for r in records if r.get("kind") == "val" or "val_reward_mean" in r]
    out = [
        charts.line_chart(
            "chart-reward",
            "Reward (mean ± std)",
            [
                _line(numbers, "train", train, "reward_mean", "reward_std"),
                _line(numbers, "validation", val, "val_reward_mean", "val_reward_std"),
            ],
        ),
        charts.line_chart(
            "chart-success",
            "Success rate",
            [_line(numbers, "train", train, "success_rate"), _line(numbers, "validation", val, "val_success_rate")],
        ),
        charts.line_chart(
            "chart-length",
            "Response length (tokens)",
            [
                _line(numbers, "mean", train, "response_length_mean"),
                _line(numbers, "max", train, "response_length_max"),
            ],
        ),
        charts.line_chart(
            "chart-kl", "KL", [_line(numbers, "kl", train, "kl"), _line(numbers, "ppo_kl", train, "ppo_kl")]
        ),
        charts.line_chart("chart-entropy", "Entropy", [_line(numbers, "entropy", train, "entropy")]),
        charts.line_chart("chart-tokens", "Tokens / s", [_line(numbers, "tokens/s", train, "tokens_per_s")]),
        _step_times(numbers, train),
        *_off_policy(numbers, train),
        *_per_policy(numbers, train),
    ]
    summary = ""
    if train:
        last = train[-1]
        summary = (
            f'<p class="muted">last step {e(_shown(last.get("step"), str))}: '
            f"reward {e(_shown(last.get('reward_mean'), number))}, "
            f"success {e(_shown(last.get('success_rate'), number))}, "
            f"step time {e(_shown(last.get('time_step_s'), seconds))}, updated {e(when(time.time()))}</p>"
        )
    if numbers.bad:
        items = "".join(f"<li>{e(line)}</li>" for line in numbers.bad)
        summary += (
            '<div class="card" id="bad-values"><p class="err">not numbers, left out of the charts:</p>'
            f"<ul>{items}</ul></div>"
        )
    return summary + '<div class="charts">' + "".join(out) + "</div>"


def _off_policy(numbers: _Numbers, train: list[dict]) -> list[str]:
    """verl's off-policy correction figures, for a run with corrected steps (none for an on-policy run)."""
    if not any(isinstance(k, str) and k.startswith(OFF_POLICY) for r in train for k in r):
        return []
    weights = [("IS mean", "rollout_is_mean"), ("IS max", "rollout_is_max")]
    weights += [("ESS", "rollout_is_eff_sample_size"), ("rejected", "rejected_fraction")]
    series = [_line(numbers, name, train, OFF_POLICY + key) for name, key in weights]
    kl = [_line(numbers, "kl", train, OFF_POLICY + "kl")]
    return [
        charts.line_chart("chart-offpolicy", "Off-policy correction", series),
        charts.line_chart("chart-offpolicy-kl", "KL(behaviour ‖ policy)", kl),
    ]


def _policy_metrics(train: list[dict]) -> dict[str, set[str]]:
    """The metrics each policy has in the step records, by policy name (sorted)."""
    found: dict[str, set[str]] = {}
    for record in train:
        for key in record:
            if isinstance(key, str) and key.startswith(POLICY):
                name, _, metric = key.removeprefix(POLICY).rpartition("/")
                if name and metric:
                    found.setdefault(name, set()).add(metric)
    return dict(sorted(found.items()))


def _per_policy(numbers: _Numbers, train: list[dict]) -> list[str]:
    """One chart per metric with a line per policy, for a run of several policies (none for a run of one).

    A policy keeps its color on every chart, whichever metrics the others lack."""
    policies = _policy_metrics(train)
    colors = {name: charts.COLORS[n % len(charts.COLORS)] for n, name in enumerate(policies)}

    def line(name: str, metric: str, label: str) -> charts.Series:
        series = _line(numbers, label, train, f"{POLICY}{name}/{metric}")
        series.color = colors[name]
        return series

    out = []
    for metric, title in POLICY_CHARTS:
        lines = [line(name, metric, name) for name, metrics in policies.items() if metric in metrics]
        if lines:
            out.append(charts.line_chart(f"chart-policy-{metric}", title, lines))
    counts = [
        line(name, metric, f"{name} {metric}")
        for name, metrics in policies.items()
        for metric in POLICY_COUNTS
        if metric in metrics
    ]
    if counts:
        out.append(charts.line_chart("chart-policy-counts", "Transitions trained / calls served per policy", counts))
    return out


def _step_times(numbers: _Numbers, train: list[dict]) -> str:
    """The stacked step-time chart: one bar per step, one segment per timing the records hold."""
    steps, parts = [], {k.removeprefix("time_").removesuffix("_s"): [] for k in STEP_TIMES}
    for record in train:
        step, times = numbers.get(record, "step"), [numbers.get(record, k) for k in STEP_TIMES]
        if step is None or all(t is None for t in times):
            continue
        steps.append(step)
        for values, t in zip(parts.values(), times, strict=True):
            values.append(t or 0.0)
    parts = {name: values for name, values in parts.items() if any(values)}
    return charts.stacked_bars("chart-time", "Step time (s)", steps, parts)
