"""Every hook agl calls, in one place.

A plugin is a module, class or object with functions named after these hooks,
marked with ``@agl.hookimpl``. Installed packages are found through the ``agl``
entry-point group (``AGL_LOAD_PLUGINS=a,b`` loads only those; empty loads none);
code registers one with :func:`agl.plugins.register`. A function named ``agl_*``
that matches no hook here is refused when the plugin is registered.

Every hook is called through pluggy's relay, so ``@hookimpl(tryfirst=True)``,
``trylast=True`` and ``wrapper=True`` work as pluggy documents. Hooks are
synchronous: an ``async def`` implementation is an error. An implementation may
take any subset of a hook's arguments, by name.

Hooks that *provide* something (a credit-assignment strategy, a backend, an
engine) take the name asked for and return None when they do not provide it;
the first non-None answer, in call order, wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import argparse

    from starlette.routing import BaseRoute

    from agl.schema import LLMCall, Reward, Rollout, Span, Transition
    from agl.store.base import Store
    from agl_trainer.backend import Backend
    from agl_trainer.credit import Strategy
    from agl_trainer.engine import Engine

hookspec = pluggy.HookspecMarker("agl")
hookimpl = pluggy.HookimplMarker("agl")


@hookspec
def agl_reward(
    rollout: Rollout, spans: Sequence[Span], llm_calls: Sequence[LLMCall], rewards: Sequence[Reward]
) -> float | Mapping[str, float] | None:
    """Score a finished rollout.

    Called once per ended rollout when transitions are built. ``rollout`` has its
    ``task`` and ``output`` filled in; ``spans``, ``llm_calls`` and ``rewards`` are
    what was recorded during it, as lazy sequences: the store is queried the first
    time one is read, so an implementation that takes only ``rollout`` costs no query.

    Return a number (the final reward), a mapping of named rewards (the one named
    ``reward`` is the final reward), or None to abstain. Every answer is stored as
    :class:`~agl.schema.Reward` rows whose ``source`` is the plugin's name. When
    several plugins answer, the first in call order gives the final reward: mark an
    implementation ``tryfirst=True`` to make it decide.

    An implementation that raises abstains for that rollout (logged, counted in
    ``BuildReport.plugin_errors``); the other plugins' answers are kept. A
    ``wrapper=True`` implementation sees the answers as a list of
    :class:`agl.plugins.RewardAnswer` (``plugin``, ``value``, ``error``) in call
    order and may return a changed list.

    Example::

        @agl.hookimpl
        def agl_reward(rollout):
            return float(rollout.output == rollout.task.input["answer"])
    """


@hookspec(firstresult=True)
def agl_credit_assignment(name: str) -> Strategy | None:
    """Return the credit-assignment strategy called ``name``, or None.

    A strategy is a callable ``(n_calls: int, rewards: RolloutRewards, **options: float)
    -> list[float]``: given how many LLM calls the rollout made and its rewards
    (:class:`agl_trainer.credit.RolloutRewards`: the ``final`` reward and the ``emitted``
    intermediate ones as ``(call index, value)``), it returns exactly ``n_calls``
    rewards, one per call in order. ``options`` are ``TransitionConfig.credit_options``.

    Example::

        @agl.hookimpl
        def agl_credit_assignment(name):
            if name == "first":
                return lambda n_calls, rewards, **_: [rewards.final] + [0.0] * (n_calls - 1)
    """


@hookspec(firstresult=True)
def agl_backend(name: str, config: dict[str, object]) -> Backend | None:
    """Return the algorithm backend called ``name`` built from ``config``, or None.

    Example::

        @agl.hookimpl
        def agl_backend(name, config):
            if name == "mine":
                return MyBackend(**config)
    """


@hookspec(firstresult=True)
def agl_engine(name: str, config: dict[str, object]) -> Engine | None:
    """Return the inference engine called ``name`` built from ``config``, or None.

    Example::

        @agl.hookimpl
        def agl_engine(name, config):
            if name == "mine":
                return MyEngine(**config)
    """


@hookspec
def agl_list_components() -> dict[str, list[str]] | None:
    """Name what this plugin provides, for ``agl plugins`` and the errors that list what is installed.

    Keys: ``credit_assignments``, ``backends``, ``engines``, ``store_schemes``, ``commands``.

    Example::

        @agl.hookimpl
        def agl_list_components():
            return {"backends": ["verl"], "engines": ["transformers"]}
    """


@hookspec
def agl_store_schemes() -> Mapping[str, Callable[..., Store]] | None:
    """Store URL schemes this plugin opens, for :func:`agl.store.open_store`.

    Return ``{scheme: opener}``; ``open_store("scheme://...", **options)`` calls
    ``opener(url, **options)``, which returns a :class:`~agl.store.Store`. The
    built-in schemes (``sqlite``, ``http``, ``https``, ``postgresql``, ``postgres``)
    cannot be replaced; where two plugins give the same scheme, the first in call
    order wins.

    Example::

        @agl.hookimpl
        def agl_store_schemes():
            return {"redis": lambda url, **options: RedisStore(url, **options)}
    """


@hookspec
def agl_register_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add subcommands to the ``agl`` command line.

    ``subparsers`` is the ``argparse`` sub-parser action of ``agl``: add a parser
    and set its ``func`` default to a callable ``(args) -> int | None`` (the exit
    status). A name ``agl`` already has is an error.

    Example::

        @agl.hookimpl
        def agl_register_commands(subparsers):
            p = subparsers.add_parser("hello", help="say hello")
            p.set_defaults(func=lambda args: print("hello"))
    """


@hookspec
def agl_rollout_ended(rollout: Rollout) -> None:
    """A rollout reached a terminal status (seen by the trainer while it waits for a step's rollouts).

    Example::

        @agl.hookimpl
        def agl_rollout_ended(rollout):
            print(rollout.rollout_id, rollout.status.value)
    """


@hookspec
def agl_transitions_built(step: int, transitions: Sequence[Transition]) -> None:
    """Transitions for training step ``step`` were built, before the backend sees them.

    Example::

        @agl.hookimpl
        def agl_transitions_built(step, transitions):
            print(step, sum(t.reward for t in transitions) / max(len(transitions), 1))
    """


@hookspec
def agl_step_ended(step: int, metrics: Mapping[str, float]) -> None:
    """Training step ``step`` ended with these metrics (for loggers: TensorBoard, W&B, …).

    Example::

        @agl.hookimpl
        def agl_step_ended(step, metrics):
            writer.add_scalars("agl", dict(metrics), step)
    """


@hookspec
def agl_store_routes(store: Store) -> Sequence[BaseRoute] | None:
    """Extra Starlette routes for ``agl store serve`` (for example agl-otel's OTLP endpoint).

    The routes are mounted next to the store's own API, behind the same bearer
    token; ``store`` is the store the server serves.

    Example::

        @agl.hookimpl
        def agl_store_routes(store):
            return [Route("/v1/ping", lambda request: PlainTextResponse("pong"))]
    """
