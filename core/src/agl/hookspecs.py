"""Every hook agl calls, in one place.

A plugin is a module, class or object with functions named after these hooks,
marked with ``@agl.hookimpl``. Installed packages are found through the ``agl``
entry-point group (``AGL_LOAD_PLUGINS=a,b`` loads only those; empty loads none);
code registers one with :func:`agl.plugins.register`. A function named ``agl_*``
that matches no hook here is refused when the plugin is registered.

Every hook is called through pluggy (its relay; ``agl_reward`` and the provider hooks
through its subset callers and ``call_extra``, so each answer carries its plugin's name),
so ``@hookimpl(tryfirst=True)``, ``trylast=True`` and ``wrapper=True`` work as pluggy
documents. Hooks are synchronous: an ``async def`` implementation is an error. An
implementation may take any subset of a hook's arguments, by name.

Hooks that *provide* something (a backend, an engine, a credit-assignment
strategy, a store scheme, a logger, a command) all have one shape, the one
simonw/llm uses for its models (``register_models(register)``)::

    @agl.hookimpl
    def agl_register_backends(register):
        register("mine", MyBackend, description="my algorithm")

``register(name, factory, description="")`` records that this plugin provides
``name``; the factory is called only when the name is used, so the hook stays
cheap (import heavy modules inside the factory). Why this shape: the registry
learns every name, and which plugin gave it, from the one call, so ``agl plugins``,
"did you mean" and "what is installed" come from the same registrations that
resolve names, and nothing else has to be kept in step. The alternatives cost
more: a ``(name) -> component | None`` hook (pluggy's ``firstresult``) cannot say
what it provides without running every factory, so it needs a second hook that
lists the names, and the two drift apart; a hook returning ``{name: factory}``
says what it provides but gives no place to check each entry where it is made or
to describe it, and it is a different shape from the one commands need. Hooks
that *take part* in a run (``agl_reward``, ``agl_rollout_ended``, …) stay ordinary
pluggy calls.

A provider hook runs when its plugin is registered (a bad name, a factory that is
not callable, or a name registered twice by one plugin is refused then, naming the
plugin and the field) and again when a name of its kind is looked up. Where two
plugins register the same name, the first in call order wins (mark an
implementation ``tryfirst=True`` to make it win); agl-trainer's built-ins are
``trylast``, so a plugin may replace them, but agl-core's store schemes may not be
replaced. See :mod:`agl.providers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from agl.schema import LLMCall, Reward, Rollout, Span, Transition

Register = Callable[..., None]
"""The ``register(name, factory, description="")`` a provider hook is called with."""

hookspec = pluggy.HookspecMarker("agl")
"""Marks the hook specifications below (for agl itself, not for plugins)."""
hookimpl = pluggy.HookimplMarker("agl")
"""Marks a plugin's function as the implementation of the hook it is named after: ``@agl.hookimpl``,
or ``@agl.hookimpl(tryfirst=True)``, ``trylast=True``, ``wrapper=True`` as pluggy documents."""


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

    The trainer calls it through :func:`agl.plugins.reward_answers`, not with pluggy's
    ``firstresult``: that would stop at the first answer, so the others would not be
    stored, and at the first exception, so one failing plugin would cost every answer.

    Example::

        @agl.hookimpl
        def agl_reward(rollout):
            return float(rollout.output == rollout.task.input["answer"])
    """


@hookspec
def agl_register_backends(register: Register) -> None:
    """Register algorithm backends: ``register(name, factory)``.

    ``factory(**config)`` returns a :class:`agl_trainer.backend.Backend`; ``config`` is
    the trainer config's ``backend.config``.

    Example::

        @agl.hookimpl
        def agl_register_backends(register):
            register("mine", MyBackend, description="my algorithm")
    """


@hookspec
def agl_register_engines(register: Register) -> None:
    """Register inference engines: ``register(name, factory)``.

    ``factory(**config)`` returns an :class:`agl_trainer.engine.Engine`; ``config`` is
    the trainer config's ``engine.config``.

    Example::

        @agl.hookimpl
        def agl_register_engines(register):
            register("mine", MyEngine)
    """


@hookspec
def agl_register_credit_assignments(register: Register) -> None:
    """Register credit-assignment strategies: ``register(name, strategy)``.

    A strategy is a callable ``(n_calls: int, rewards: RolloutRewards, **options: float)
    -> list[float]``: given how many LLM calls the rollout made and its rewards
    (:class:`agl_trainer.credit.RolloutRewards`: the ``final`` reward and the ``emitted``
    intermediate ones as ``(call index, value)``), it returns exactly ``n_calls``
    rewards, one per call in order. ``options`` are ``TransitionConfig.credit_options``.

    Example::

        @agl.hookimpl
        def agl_register_credit_assignments(register):
            register("first", lambda n_calls, rewards, **_: [rewards.final] + [0.0] * (n_calls - 1))
    """


@hookspec
def agl_register_store_schemes(register: Register) -> None:
    """Register store URL schemes for :func:`agl.store.open_store`: ``register(scheme, opener)``.

    ``open_store("scheme://...", **options)`` calls ``opener(url, **options)``, which
    returns a :class:`~agl.store.Store`. A scheme is lower case. agl-core's own
    (``sqlite``, ``http``, ``https``, ``postgresql``, ``postgres``) are registered the
    same way by :mod:`agl.store.schemes` and cannot be replaced.

    Example::

        @agl.hookimpl
        def agl_register_store_schemes(register):
            register("redis", lambda url, **options: RedisStore(url, **options))
    """


@hookspec
def agl_register_loggers(register: Register) -> None:
    """Register experiment-tracker loggers for the trainer config's ``loggers``: ``register(name, cls)``.

    ``cls`` is a :class:`agl_trainer.loggers.Logger` subclass: its ``options_model``
    checks the entry's options and ``cls(options)`` makes the logger.

    Example::

        @agl.hookimpl
        def agl_register_loggers(register):
            register("mlflow", MlflowLogger, description="MLflow tracking")
    """


@hookspec
def agl_register_commands(register: Register) -> None:
    """Register ``agl`` subcommands: ``register(name, configure, description)``.

    ``agl`` makes the parser of ``agl NAME`` (``description`` is its help) and calls
    ``configure(parser)``, which adds the arguments and sets the ``func`` default to a
    callable ``(args) -> int | None`` (the exit status). A name ``agl`` already has is
    an error naming the plugin.

    Example::

        @agl.hookimpl
        def agl_register_commands(register):
            def configure(parser):
                parser.add_argument("--name", default="world")
                parser.set_defaults(func=lambda args: print(f"hello {args.name}"))

            register("hello", configure, description="say hello")
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
def agl_store_routes(store: Any) -> Sequence[BaseRoute] | None:
    """Extra Starlette routes for ``agl store serve`` (for example agl-otel's OTLP endpoint).

    The routes are mounted next to the store's own API, behind the same bearer
    token; ``store`` is the :class:`agl.store.Store` the server serves. (It is annotated
    ``Any``: the store opens its schemes through this registry, so naming its class here,
    even for type checkers only, would make the two modules import each other.)

    Example::

        @agl.hookimpl
        def agl_store_routes(store):
            return [Route("/v1/ping", lambda request: PlainTextResponse("pong"))]
    """
