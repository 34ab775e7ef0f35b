"""Credit assignment: spreading a rollout's rewards over its LLM calls (LightningRL).

A strategy takes a rollout's rewards and how many LLM calls it made, and returns
one reward per call. The built-in ones are registered as a plugin, so a package
can add its own through the ``agl_register_credit_assignments`` hook.

- ``broadcast``: every call gets the final reward (the paper's default).
- ``last``: only the final call is rewarded; the others get 0.
- ``discounted``: the final reward times ``gamma`` per step back from the end.
- ``emitted``: returns-to-go over the intermediate rewards emitted during the run
  (each attached to the last call made before it), plus the final reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agl.hookspecs import Register, hookimpl


@dataclass
class RolloutRewards:
    """The rewards of one rollout, placed relative to its LLM calls."""

    final: float
    emitted: list[tuple[int, float]] = field(default_factory=list)
    """``(call index, value)``: the index of the last call made before the reward (-1: before any)."""


class Strategy(Protocol):
    """A credit-assignment strategy: one reward per LLM call of a rollout, in call order.

    Called with how many calls the rollout made, its rewards, and the options of
    ``TransitionConfig.credit_options``; must return exactly ``n_calls`` numbers.
    """

    def __call__(self, n_calls: int, rewards: RolloutRewards, /, **options: float) -> list[float]: ...


def broadcast(n_calls: int, rewards: RolloutRewards, **_: float) -> list[float]:
    """Every call gets the final reward."""
    return [rewards.final] * n_calls


def last(n_calls: int, rewards: RolloutRewards, **_: float) -> list[float]:
    """The last call gets the final reward, the others 0."""
    return [0.0] * (n_calls - 1) + [rewards.final] if n_calls else []


def discounted(n_calls: int, rewards: RolloutRewards, *, gamma: float = 0.9, **_: float) -> list[float]:
    """The final reward times ``gamma`` per call back from the last (``gamma`` in [0, 1])."""
    _check_gamma(gamma)
    return [rewards.final * gamma ** (n_calls - 1 - i) for i in range(n_calls)]


def emitted(n_calls: int, rewards: RolloutRewards, *, gamma: float = 1.0, **_: float) -> list[float]:
    """Returns-to-go: each call gets what was emitted after it (discounted by ``gamma``) plus the final reward."""
    _check_gamma(gamma)
    if not n_calls:
        return []
    immediate = [0.0] * n_calls
    for index, value in rewards.emitted:
        immediate[min(max(index, 0), n_calls - 1)] += value
    immediate[-1] += rewards.final
    returns = [0.0] * n_calls
    running = 0.0
    for i in range(n_calls - 1, -1, -1):
        running = immediate[i] + gamma * running
        returns[i] = running
    return returns


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: must be between 0 and 1, got {gamma}")


BUILTIN: dict[str, Strategy] = {
    "broadcast": broadcast,
    "last": last,
    "discounted": discounted,
    "emitted": emitted,
}


@hookimpl(trylast=True)
def agl_register_credit_assignments(register: Register) -> None:
    """The built-in strategies; asked last, so a plugin can register one of the same name."""
    for name, strategy in BUILTIN.items():
        register(name, strategy, description=(strategy.__doc__ or "").strip().splitlines()[0])
