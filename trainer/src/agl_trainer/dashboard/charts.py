"""Charts as inline SVG, drawn on the server: lines with an optional ±std band, and stacked bars.

Each point is a ``<circle>`` carrying ``data-series``, ``data-step`` and ``data-value`` and
a ``<title>`` (the tooltip), so the numbers a chart shows can be read back from the page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agl_trainer.dashboard.html import e

WIDTH, HEIGHT = 520, 210
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 26
COLORS = ("#2c6bd6", "#d2691e", "#1b7f3b", "#8e44ad", "#c0392b", "#16a085")


@dataclass
class Series:
    """One line: ``(step, value)`` points and, for a band, each point's spread (the std); ``color``
    keeps one thing (a policy) the same color on every chart (else the line's place picks it)."""

    name: str
    points: list[tuple[float, float]]
    spread: list[float] | None = None
    color: str | None = None


def nice_ticks(lo: float, hi: float, *, count: int = 5, whole: bool = False) -> list[float]:
    """Round ticks covering ``[lo, hi]``: multiples of 1, 2 or 5 × 10^k, about ``count`` of them,
    the first at or below ``lo`` and the last at or above ``hi`` (the axis spans them).
    ``whole`` keeps the spacing at 1 or more (an axis of step numbers)."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    if not math.isfinite(hi - lo):  # a range past the largest float: its ends are the ticks
        return [lo, hi]
    raw = (hi - lo) / max(count - 1, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    if whole:
        step = max(step, 1.0)
    decimals = max(0, -math.floor(math.log10(step)))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, decimals) + 0.0 for k in range(first, last + 1)]  # + 0.0: no "-0"


def tick_labels(ticks: list[float]) -> list[str]:
    """Each tick written with as many digits as the spacing needs, all alike: ``0.2``, ``-5e-08``."""
    if len(ticks) < 2:
        return [f"{t:g}" for t in ticks]
    step = abs(ticks[1] - ticks[0])
    largest = max(abs(t) for t in ticks)
    if not 0 < step < math.inf:
        return [f"{t:.3g}" for t in ticks]
    if step >= 1e-4 and largest < 1e7:
        decimals = max(0, -math.floor(math.log10(step)))
        return [f"{t:.{decimals}f}" for t in ticks]
    digits = max(1, math.floor(math.log10(largest)) - math.floor(math.log10(step)) + 1)
    return [f"{t:.{digits}g}" for t in ticks]


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _frame(title: str, xs: list[float], lo: float, hi: float) -> tuple[list[str], callable, callable]:
    x_ticks = nice_ticks(*((min(xs), max(xs)) if xs else (0.0, 1.0)), whole=True)
    y_ticks = nice_ticks(lo, hi)
    x0, x1, lo, hi = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    y_labels = tick_labels(y_ticks)
    # wide enough for the longest label whole (about 6.5 px a character at 11 px)
    left = max(LEFT, round(10 + 6.5 * max(len(label) for label in y_labels)))
    span_x, span_y = WIDTH - left - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * span_x

    def py(y: float) -> float:
        return TOP + (1 - (y - lo) / (hi - lo)) * span_y

    out = [f'<rect x="{left}" y="{TOP}" width="{span_x}" height="{span_y}" fill="#fbfbfd" stroke="#e3e6ec"/>']
    for t, label in zip(y_ticks, y_labels, strict=True):
        y = py(t)
        out.append(f'<line x1="{left}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eceef2"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" class="y-tick">{label}</text>')
    for t, label in zip(x_ticks, tick_labels(x_ticks), strict=True):
        out.append(f'<text x="{px(t):.1f}" y="{HEIGHT - 8}" text-anchor="middle" class="x-tick">{label}</text>')
    return out, px, py


def line_chart(chart_id: str, title: str, series: list[Series]) -> str:
    """An SVG line chart of ``series`` (a band of ±spread around each line that has one)."""
    series = [s for s in series if s.points]
    if not series:
        return f'<div class="card" id="{e(chart_id)}"><h3>{e(title)}</h3><p class="muted">no data</p></div>'
    xs = [x for s in series for x, _ in s.points]
    ys: list[float] = []
    for s in series:
        for i, (_, y) in enumerate(s.points):
            d = s.spread[i] if s.spread else 0.0
            ys += [y - d, y + d]
    parts, px, py = _frame(title, xs, min(ys), max(ys))
    legend = []
    for n, s in enumerate(series):
        color = s.color or COLORS[n % len(COLORS)]
        if s.spread:
            upper = [f"{px(x):.1f},{py(y + d):.1f}" for (x, y), d in zip(s.points, s.spread, strict=True)]
            lower = [f"{px(x):.1f},{py(y - d):.1f}" for (x, y), d in zip(s.points, s.spread, strict=True)]
            band = " ".join(upper + lower[::-1])
            parts.append(f'<polygon points="{band}" fill="{color}" fill-opacity="0.15" stroke="none"/>')
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        for i, (x, y) in enumerate(s.points):
            tip = f"{s.name} step {_fmt(x)}: {y:.6g}" + (f" ± {s.spread[i]:.4g}" if s.spread else "")
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.6" fill="{color}" data-series="{e(s.name)}" '
                f'data-step="{x:g}" data-value="{y!r}"><title>{e(tip)}</title></circle>'
            )
        last = s.points[-1][1]
        legend.append(
            f'<span style="color:{color}">■</span> <span class="legend" data-series="{e(s.name)}">'
            f"{e(s.name)}: {last:.4g}</span>"
        )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{e(title)}">{"".join(parts)}</svg>'
    )
    return f'<div class="card" id="{e(chart_id)}"><h3>{e(title)}</h3>{svg}<div>{" &nbsp; ".join(legend)}</div></div>'


def stacked_bars(chart_id: str, title: str, steps: list[float], parts_by_name: dict[str, list[float]]) -> str:
    """An SVG stacked bar chart: one bar per step, one colored segment per named part."""
    if not steps or not parts_by_name:
        return f'<div class="card" id="{e(chart_id)}"><h3>{e(title)}</h3><p class="muted">no data</p></div>'
    totals = [sum(v[i] for v in parts_by_name.values()) for i in range(len(steps))]
    parts, px, py = _frame(title, steps, 0.0, max(totals) or 1.0)
    span_x = px(max(steps)) - px(min(steps)) if len(steps) > 1 else WIDTH - LEFT - RIGHT
    bar = max(2.0, min(24.0, span_x / (len(steps) + 1) * 0.7))
    for i, step in enumerate(steps):
        base = 0.0
        for n, (name, values) in enumerate(parts_by_name.items()):
            v = values[i]
            if v <= 0:
                continue
            y_top, y_bottom = py(base + v), py(base)
            parts.append(
                f'<rect x="{px(step) - bar / 2:.1f}" y="{y_top:.1f}" width="{bar:.1f}" height="{y_bottom - y_top:.1f}" '
                f'fill="{COLORS[n % len(COLORS)]}" data-series="{e(name)}" data-step="{step:g}" data-value="{v!r}">'
                f"<title>{e(f'{name} step {step:g}: {v:.4g} s')}</title></rect>"
            )
            base += v
    legend = " &nbsp; ".join(
        f'<span style="color:{COLORS[n % len(COLORS)]}">■</span> {e(name)}' for n, name in enumerate(parts_by_name)
    )
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{"".join(parts)}</svg>'
    return f'<div class="card" id="{e(chart_id)}"><h3>{e(title)}</h3>{svg}<div>{legend}</div></div>'
