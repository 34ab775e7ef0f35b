"""The rollout's rewards: what reward plugins answer, the final reward's precedence, where emitted ones go."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agl.schema import Reward, Rollout
from agl.store.base import Store
from agl.transitions.config import BuildReport

log = logging.getLogger("agl.transitions")  # the package's logger, as before it was split

RETURN_SOURCE = "return"
"""The source of a reward the agent function returned (written by the runner)."""


def _plugin_rewards(rollout: Rollout, store: Store, report: BuildReport, impls: list[tuple[str, Any]]) -> list[Reward]:
    """Run every ``agl_reward`` implementation (``(plugin name, hookimpl)``); return what they gave as Reward rows."""
    out: list[Reward] = []
    lazy: dict[str, Any] = {}
    for source, impl in impls:
        kwargs: dict[str, Any] = {}
        for name in impl.argnames:
            if name == "rollout":
                kwargs[name] = rollout
            elif name not in lazy:
                if name == "spans":
                    lazy[name] = list(store.query_spans(rollout_id=rollout.rollout_id))
                elif name == "llm_calls":
                    lazy[name] = list(store.query_llm_calls(rollout_id=rollout.rollout_id))
                elif name == "rewards":
                    lazy[name] = list(store.query_rewards(rollout_id=rollout.rollout_id))
            if name != "rollout":
                kwargs[name] = lazy[name]
        try:
            answer = impl.function(**kwargs)
        except Exception as exc:
            report.plugin_errors += 1
            log.warning("reward plugin %s failed on rollout %s: %s: %s", source, rollout.rollout_id, type(exc).__name__, exc)
            continue
        if answer is None:
            continue
        named = answer if isinstance(answer, dict) else {"reward": answer}
        for name, value in named.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                report.plugin_errors += 1
                log.warning("reward plugin %s: reward %r of rollout %s is not a number: %r", source, name, rollout.rollout_id, value)
                continue
            out.append(
                Reward(
                    reward_id=f"rw-{rollout.rollout_id}-a{rollout.attempt}-{source}-{name}",
                    rollout_id=rollout.rollout_id, name=name, value=value, source=source,
                )
            )
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
