"""The rollout's rewards: what reward plugins answer, the final reward's precedence, where emitted ones go."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from agl.plugins import RewardAnswer
from agl.schema import RETURN_SOURCE, Reward, Rollout, Task, now
from agl.store.base import Store
from agl_trainer.transitions.config import BuildReport

log = logging.getLogger("agl_trainer.transitions")

T = TypeVar("T")


class LazyRecords(Sequence[T]):
    """A read-only sequence that runs its query the first time it is read (what ``agl_reward`` gets).

    A plugin that never reads ``spans``, ``llm_calls`` or ``rewards`` costs no query.
    """

    __slots__ = ("_load", "_items")

    def __init__(self, load: Callable[[], Iterable[T]]):
        self._load: Callable[[], Iterable[T]] | None = load
        self._items: list[T] = []

    def _all(self) -> list[T]:
        if self._load is not None:
            self._items = list(self._load())
            self._load = None
        return self._items

    def __getitem__(self, index):  # type: ignore[override]
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[T]:
        return iter(self._all())

    def __repr__(self) -> str:
        return f"LazyRecords({'not loaded' if self._load is not None else self._items!r})"


def with_task(rollout: Rollout, task: Task) -> Rollout:
    """The rollout with its task filled in (``model_copy``: the task was validated when it was read)."""
    return rollout.model_copy(update={"task": task})


def plugin_rewards(rollout: Rollout, store: Store, report: BuildReport, call: Callable[..., list[Any]]) -> list[Reward]:
    """Call ``agl_reward`` through ``call`` (:func:`agl.plugins.reward_answers`); return the answers as Reward rows,
    counting the failures."""
    rid = rollout.rollout_id
    answers = call(
        rollout=rollout,
        spans=LazyRecords(lambda: store.query_spans(rollout_id=rid)),
        llm_calls=LazyRecords(lambda: store.query_llm_calls(rollout_id=rid)),
        rewards=LazyRecords(lambda: store.query_rewards(rollout_id=rid)),
    )
    out: list[Reward] = []
    for answer in answers:
        if not isinstance(answer, RewardAnswer):
            report.plugin_errors += 1
            log.warning(
                "agl_reward on rollout %s: a wrapper returned %r; answers must be agl.plugins.RewardAnswer", rid, answer
            )
        elif answer.error is not None:
            report.plugin_errors += 1
            log.warning(
                "reward plugin %s failed on rollout %s: %s: %s",
                answer.plugin,
                rid,
                type(answer.error).__name__,
                answer.error,
            )
        elif answer.value is not None:
            _append_rewards(out, rollout, answer, report)
    return out


def _append_rewards(out: list[Reward], rollout: Rollout, answer: RewardAnswer, report: BuildReport) -> None:
    """Append one plugin's answer (a number or named numbers) to ``out`` as Reward rows."""
    rid, source, value = rollout.rollout_id, answer.plugin, answer.value
    named = value if isinstance(value, Mapping) else {"reward": value}
    for name, number in named.items():
        if not isinstance(name, str):
            report.plugin_errors += 1
            log.warning("reward plugin %s: reward name %r of rollout %s is not a string", source, name, rid)
            continue
        try:
            number = float(number)
        except (TypeError, ValueError):
            report.plugin_errors += 1
            log.warning("reward plugin %s: reward %r of rollout %s is not a number: %r", source, name, rid, number)
            continue
        # Every field is checked above (str ids, name and source; a float value): no validation needed.
        # created_at is given so that model_construct calls no default factory (it inspects each one's signature).
        out.append(
            Reward.model_construct(
                reward_id=f"rw-{rid}-a{rollout.attempt}-{source}-{name}",
                rollout_id=rid,
                name=name,
                value=number,
                source=source,
                created_at=now(),
            )
        )


def final_reward(rewards: Sequence[Reward], plugin_sources: Collection[str]) -> tuple[float | None, Reward | None]:
    """The final reward by precedence: returned > plugin > last emitted ``reward``. Returns (value, the reward)."""
    returned = plugin = emitted = None
    for r in rewards:
        if r.name != "reward":
            continue
        if r.source == RETURN_SOURCE:
            returned = r
        elif r.source in plugin_sources:
            plugin = plugin or r  # the first plugin in call order wins
        else:
            emitted = r
    chosen = returned or plugin or emitted
    return (None, None) if chosen is None else (chosen.value, chosen)


def index_before(times: list[float], t: float) -> int:
    """Index of the last call made at or before ``t`` (-1: before any)."""
    index = -1
    for i, ct in enumerate(times):
        if ct <= t:
            index = i
        else:
            break
    return index
