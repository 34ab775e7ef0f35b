"""The rollout's rewards: what reward plugins answer, the final reward's precedence, where emitted ones go."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agl.schema import Reward, Rollout, Task, now
from agl.store.base import Store
from agl.transitions.config import BuildReport

log = logging.getLogger("agl.transitions")  # the package's logger, as before it was split

RETURN_SOURCE = "return"
"""The source of a reward the agent function returned (written by the runner)."""


_new = object.__new__
_set = object.__setattr__
_REWARD_GIVEN = ("reward_id", "rollout_id", "name", "value", "source")


def _reward(reward_id: str, rollout_id: str, name: str, value: float, source: str) -> Reward:
    """``Reward(reward_id=..., rollout_id=..., name=..., value=..., source=...)`` for values already
    checked (str ids, name and source, a float value), without validation: the model's defaults for
    the rest, the same fields set; checked against the validated model when this module is imported."""
    obj = _new(Reward)
    _set(obj, "__dict__", {"reward_id": reward_id, "rollout_id": rollout_id, "span_id": None, "name": name,
                           "value": value, "source": source, "seq": 0, "created_at": now()})
    _set(obj, "__pydantic_fields_set__", set(_REWARD_GIVEN))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def _with_task(rollout: Rollout, task: Task) -> Rollout:
    """``rollout.model_copy(update={"task": task})`` without pydantic's generic copy (checked at import)."""
    if rollout.__class__ is not Rollout or rollout.__pydantic_extra__ is not None or rollout.__pydantic_private__ is not None:
        return rollout.model_copy(update={"task": task})
    obj = _new(Rollout)
    values = rollout.__dict__.copy()
    values["task"] = task
    _set(obj, "__dict__", values)
    fields_set = set(rollout.__pydantic_fields_set__)
    fields_set.add("task")
    _set(obj, "__pydantic_fields_set__", fields_set)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def _check_shortcuts() -> None:
    checked = Reward(reward_id="rw-r", rollout_id="r", name="reward", value=1.0, source="p")
    fast = _reward("rw-r", "r", "reward", 1.0, "p")
    fast.__dict__["created_at"] = checked.created_at
    rollout = Rollout(rollout_id="r", task_id="t", step=1, output="x")
    task = Task(task_id="t", input={"a": 1})
    copied, made = rollout.model_copy(update={"task": task}), _with_task(rollout, task)
    for a, b in ((checked, fast), (copied, made)):
        if (a != b or list(a.__dict__) != list(b.__dict__) or a.__pydantic_fields_set__ != b.__pydantic_fields_set__
                or a.__pydantic_extra__ != b.__pydantic_extra__ or a.__pydantic_private__ != b.__pydantic_private__):
            raise RuntimeError(f"agl.transitions: {type(a).__name__}'s fields changed; update agl.transitions.rewards")


_check_shortcuts()


def _plugin_rewards(rollout: Rollout, store: Store, report: BuildReport, impls: list[tuple[str, Any]]) -> list[Reward]:
    """Run every ``agl_reward`` implementation (``(plugin name, hookimpl)``); return what they gave as Reward rows."""
    out: list[Reward] = []
    lazy: dict[str, Any] = {}
    rid = rollout.rollout_id
    for source, impl in impls:
        argnames = impl.argnames
        if argnames == ("rollout",):  # the usual plugin: nothing to load
            kwargs: dict[str, Any] = {"rollout": rollout}
        else:
            kwargs = {}
            for name in argnames:
                if name == "rollout":
                    kwargs[name] = rollout
                elif name not in lazy:
                    if name == "spans":
                        lazy[name] = list(store.query_spans(rollout_id=rid))
                    elif name == "llm_calls":
                        lazy[name] = list(store.query_llm_calls(rollout_id=rid))
                    elif name == "rewards":
                        lazy[name] = list(store.query_rewards(rollout_id=rid))
                if name != "rollout":
                    kwargs[name] = lazy[name]
        try:
            answer = impl.function(**kwargs)
        except Exception as exc:
            report.plugin_errors += 1
            log.warning("reward plugin %s failed on rollout %s: %s: %s", source, rid, type(exc).__name__, exc)
            continue
        if answer is None:
            continue
        named = answer if isinstance(answer, dict) else {"reward": answer}
        for name, value in named.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                report.plugin_errors += 1
                log.warning("reward plugin %s: reward %r of rollout %s is not a number: %r", source, name, rid, value)
                continue
            reward_id = f"rw-{rid}-a{rollout.attempt}-{source}-{name}"
            if name.__class__ is str and source.__class__ is str and rid.__class__ is str:
                out.append(_reward(reward_id, rid, name, value, source))
            else:  # let the model refuse (or coerce) what is not a string, as it always did
                out.append(Reward(reward_id=reward_id, rollout_id=rid, name=name, value=value, source=source))
    return out


def final_reward(rewards: Sequence[Reward], plugin_sources: set[str]) -> tuple[float | None, Reward | None]:
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


def _index_before(times: list[float], t: float) -> int:
    """Index of the last call made at or before ``t`` (-1: before any)."""
    index = -1
    for i, ct in enumerate(times):
        if ct <= t:
            index = i
        else:
            break
    return index
