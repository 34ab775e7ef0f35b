"""The dashboard's rollout list filter (from a request's query parameters) and what it reads of the store.

Every read goes through the :class:`~agl.store.base.Store` interface: a SQL store answers a page
of rollouts in one indexed statement (:mod:`agl.store.sql.dashboard`), any other store through
its queries (:mod:`agl.store.listing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agl.schema import RolloutStatus
from agl.store.base import Store
from agl.store.listing import ROLLOUT_SORTS, RolloutListQuery, RolloutRow, RunSummary

__all__ = [
    "MODES",
    "PAGE_SIZES",
    "SORTS",
    "BadFilter",
    "RolloutFilter",
    "RolloutRow",
    "list_rollouts",
    "production_span_count",
    "run_transition_configs",
    "runs",
]

PAGE_SIZES = (25, 50, 100, 200)
MODES = ("train", "val", "production")

SORTS = ROLLOUT_SORTS
"""Sortable columns, by their name in the URL (``?sort=``)."""


class BadFilter(ValueError):
    """A filter value the dashboard cannot use; ``field`` names the query parameter."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass
class RolloutFilter:
    """The rollout list's query parameters, validated."""

    task: str | None = None
    status: list[str] = field(default_factory=list)
    mode: str | None = None
    agent: str | None = None
    model: str | None = None
    step: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    duration_min: float | None = None
    duration_max: float | None = None
    error: str | None = None
    """Text the error contains; ``*`` for any error."""
    sort: str = "created"
    desc: bool = True
    page: int = 1
    size: int = 50

    @classmethod
    def from_params(cls, params: Any) -> RolloutFilter:
        """From a request's query parameters (a multi-dict); :class:`BadFilter` for a bad value."""

        def text(name: str) -> str | None:
            value = (params.get(name) or "").strip()
            return value or None

        def number(name: str, kind: type = float) -> Any:
            value = text(name)
            if value is None:
                return None
            try:
                out = kind(value)
            except ValueError:
                raise BadFilter(name, f"expected a{'n integer' if kind is int else ' number'}, got {value!r}") from None
            if out != out or out in (float("inf"), float("-inf")):
                raise BadFilter(name, f"expected a finite number, got {value!r}")
            return out

        statuses = [s for s in params.getlist("status") if s]
        known = {s.value for s in RolloutStatus}
        for s in statuses:
            if s not in known:
                raise BadFilter("status", f"unknown status {s!r} (known: {', '.join(sorted(known))})")
        mode = text("mode")
        if mode is not None and mode not in MODES:
            raise BadFilter("mode", f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        sort = text("sort") or "created"
        if sort not in SORTS:
            raise BadFilter("sort", f"cannot sort by {sort!r} (columns: {', '.join(SORTS)})")
        order = text("dir") or "desc"
        if order not in ("asc", "desc"):
            raise BadFilter("dir", f"expected asc or desc, got {order!r}")
        page = number("page", int) or 1
        if page < 1:
            raise BadFilter("page", f"must be at least 1, got {page}")
        size = number("size", int) or 50
        if size not in PAGE_SIZES:
            raise BadFilter("size", f"must be one of {', '.join(map(str, PAGE_SIZES))}, got {size}")
        return cls(
            task=text("task"),
            status=statuses,
            mode=mode,
            agent=text("agent"),
            model=text("model"),
            step=number("step", int),
            reward_min=number("reward_min"),
            reward_max=number("reward_max"),
            duration_min=number("duration_min"),
            duration_max=number("duration_max"),
            error=text("error"),
            sort=sort,
            desc=order == "desc",
            page=page,
            size=size,
        )

    def query(self) -> RolloutListQuery:
        """The store query of this filter's page."""
        return RolloutListQuery(
            task=self.task,
            status=tuple(self.status),
            mode=self.mode,
            agent=self.agent,
            model=self.model,
            step=self.step,
            reward_min=self.reward_min,
            reward_max=self.reward_max,
            duration_min=self.duration_min,
            duration_max=self.duration_max,
            error=self.error,
            sort=self.sort,
            desc=self.desc,
            offset=(self.page - 1) * self.size,
            limit=self.size,
        )

    def params(self, **override: Any) -> list[tuple[str, str]]:
        """The query parameters that give this filter (with ``override`` applied), for links."""
        values = {**self.__dict__, **override}
        out: list[tuple[str, str]] = []
        for name in (
            "task",
            "mode",
            "agent",
            "model",
            "step",
            "reward_min",
            "reward_max",
            "duration_min",
            "duration_max",
            "error",
        ):
            if values[name] is not None:
                out.append((name, str(values[name])))
        out.extend(("status", s) for s in values["status"])
        out += [("sort", values["sort"]), ("dir", "desc" if values["desc"] else "asc")]
        out += [("page", str(values["page"])), ("size", str(values["size"]))]
        return out


def list_rollouts(store: Store, flt: RolloutFilter) -> tuple[list[RolloutRow], int]:
    """One page of rollouts and how many match the filter in all."""
    page = store.list_rollouts(flt.query())
    return page.rows, page.total


def production_span_count(store: Store) -> int:
    """Spans captured outside any rollout (gateway traffic of no rollout)."""
    return store.count_spans(production=True)


def runs(store: Store) -> list[RunSummary]:
    """Every run with step records, newest first."""
    return store.runs()


def run_transition_configs(store: Store) -> dict[str, dict[str, Any]]:
    """``{run_id: transitions config}`` of every training run that recorded one (its ``config`` step record)."""
    out = {}
    for run_id, record in store.latest_step_records("config").items():
        config = record.get("transitions")
        if isinstance(config, dict):
            out[run_id] = config
    return out
