"""Every hook agl calls, in one place.

Plugins implement these with ``@agl.hookimpl`` and are found through the ``agl``
entry-point group, or registered in code with :func:`agl.plugins.register`.
Hooks are synchronous (pluggy is): an ``async def`` implementation is an error.

Hooks that *provide* something (a credit-assignment strategy, a backend, an
engine) take the name asked for and return None when they do not provide it;
the first non-None answer wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from agl.schema import Rollout, Transition

hookspec = pluggy.HookspecMarker("agl")
hookimpl = pluggy.HookimplMarker("agl")


@hookspec
def agl_reward(rollout: "Rollout", spans: list, llm_calls: list, rewards: list) -> float | dict[str, float] | None:
    """Score a finished rollout.

    Called once per ended rollout when transitions are built, with the rollout
    (its ``task`` and ``output`` filled in) and what was recorded during it.
    Return a number (the final reward), a dict of named rewards (the one named
    ``reward`` is the final reward), or None to abstain. Every non-None answer is
    stored as a reward with the plugin's name as its source.
    """


@hookspec(firstresult=True)
def agl_credit_assignment(name: str) -> Any:
    """Return the credit-assignment strategy called ``name``, or None.

    A strategy is a callable ``(calls: list[CallRecord], rewards: RolloutRewards,
    **options) -> list[float]`` giving one reward per LLM call of a rollout (see
    :mod:`agl.credit`).
    """


@hookspec(firstresult=True)
def agl_backend(name: str, config: dict) -> Any:
    """Return an algorithm backend called ``name`` built from ``config``, or None."""


@hookspec(firstresult=True)
def agl_engine(name: str, config: dict) -> Any:
    """Return an inference engine called ``name`` built from ``config``, or None."""


@hookspec
def agl_list_components() -> dict[str, list[str]] | None:
    """Name what this plugin provides, for ``agl plugins``.

    For example ``{"backends": ["verl"], "engines": ["transformers"]}``.
    """


@hookspec
def agl_rollout_ended(rollout: "Rollout") -> None:
    """A rollout reached a terminal status (seen by the trainer)."""


@hookspec
def agl_transitions_built(step: int, transitions: "list[Transition]") -> None:
    """Transitions for a training step were built, before the backend sees them."""


@hookspec
def agl_step_ended(step: int, metrics: dict[str, float]) -> None:
    """A training step ended with these metrics (loggers: TensorBoard, W&B, …)."""


@hookspec
def agl_store_routes(store) -> list | None:
    """Extra Starlette routes for ``agl store serve`` (for example agl-otel's OTLP endpoint).

    Return a list of ``starlette.routing.Route``; they are mounted next to the
    store's own API and sit behind the same bearer token.
    """
