"""The trainer's side of a run's policies: a backend per trained policy, their versions, who trains on what.

A run that names no policy, or one, keeps today's shape: one backend, the engine's default
weights, metrics without a prefix. A run of several gives each trained policy its own
backend (its own optimizer, checkpoint directory and published versions), serves every
policy as a named policy of the engine, and writes each policy's metrics as
``policy/<name>/<metric>``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agl.errors import ConfigError
from agl.schema import ModelVersion, Transition
from agl_trainer.backend import Backend
from agl_trainer.engine import Engine
from agl_trainer.policy_config import PolicyConfig, effective_policies
from agl_trainer.policy_routes import Routes

BASE_VERSION = "base"
"""The version of a policy that serves the engine's model as it is."""


def weighted_per_rollout(transitions: list[Transition]) -> list[Transition]:
    """``transitions`` each weighted 1 / (calls of its rollout among them): a merged row counts its
    calls, and keeps the weight of one call (its loss spans them all)."""
    calls: Counter[str] = Counter()
    for t in transitions:
        calls[t.rollout_id] += len(t.segments) if t.segments else 1
    return [
        t if t.weight == 1.0 / calls[t.rollout_id] else t.model_copy(update={"weight": 1.0 / calls[t.rollout_id]})
        for t in transitions
    ]


@dataclass
class Policy:
    """One policy of the run as the trainer holds it."""

    config: PolicyConfig
    engine_name: str | None
    """The policy's name at the engine (``ModelVersion.policy``); None: the engine's default weights."""
    backend: Backend | None = None
    version: str | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def trains_on(self, t: Transition) -> bool:
        """Whether ``t`` (a call this policy served) is one it learns from (its ``agents`` filter)."""
        agents = self.config.agents
        return agents is None or t.agent in agents


class PolicySet:
    """The run's policies (:attr:`TrainerConfig.policies`, or the one default policy)."""

    def __init__(self, configs: Sequence[PolicyConfig]):
        self.named = bool(configs)
        """Whether the run names its policies: the gateway then routes calls and records their policy."""
        policies = effective_policies(configs)
        several = len(policies) > 1
        self.policies = [Policy(p, p.name if several else None) for p in policies]
        self.prefixed = several
        """Whether each policy's metrics go under ``policy/<name>/``."""

    # -- set-up ---------------------------------------------------------------------------
    @property
    def trained(self) -> list[Policy]:
        return [p for p in self.policies if p.config.train]

    def make_backends(self, given: Backend | None, resolve: Callable[[dict], Backend | None]) -> None:
        """A backend for each trained policy: ``given`` (one policy only), else ``resolve(config)`` with the
        policy's ``backend`` settings over ``backend.config``."""
        trained = self.trained
        if given is not None:
            if len(trained) > 1:
                raise ConfigError(
                    f"backend: one backend object cannot train {len(trained)} policies; "
                    "name the backend in the config (backend: {name: ..., config: ...}) so each gets its own"
                )
            if trained:
                trained[0].backend = given
            return
        for p in trained:
            p.backend = resolve(p.config.backend)

    @property
    def backends(self) -> list[tuple[Policy, Backend]]:
        return [(p, p.backend) for p in self.policies if p.backend is not None]

    def first_backend(self) -> Backend | None:
        return next((b for _, b in self.backends), None)

    def start_versions(self, state: dict, engine: Engine | None) -> None:
        """Each policy's version: the state's (a resumed run), else its starting one; frozen ones are
        served by the engine now, and a resumed run's trained ones are reloaded by :meth:`serve_resumed`."""
        saved = state.get("policy_versions") or {}
        for p in self.policies:
            if p.name in saved:
                p.version = saved[p.name]
            elif p.config.train:
                p.version = state["model_version"] if p.engine_name is None else BASE_VERSION
            else:
                p.version = f"{p.name}-weights" if p.config.weights else BASE_VERSION
            if engine is not None and p.engine_name is not None and not p.config.train:
                engine.load_version(ModelVersion(version=p.version, path=p.config.weights, policy=p.engine_name))
        if self.named:
            state["policy_versions"] = self.versions()

    def serve_resumed(self, engine: Engine, get_version: Callable[[str], ModelVersion | None]) -> None:
        """Have the engine serve each trained named policy's version (a resumed run, or its start)."""
        for p in self.trained:
            if p.engine_name is None:
                continue
            mv = get_version(p.version) if p.version != BASE_VERSION else None
            mv = mv or ModelVersion(version=p.version, path=None)
            engine.load_version(mv.model_copy(update={"policy": p.engine_name}))

    def routes(self, engine: Engine | None) -> Routes | None:
        """The gateway's table (a run that names its policies), each policy at its version now."""
        if not self.named:
            return None
        upstream = {
            p.name: (engine.policy_model(p.engine_name) if engine is not None else p.engine_name)
            if p.engine_name is not None
            else None
            for p in self.policies
        }
        routes = Routes([p.config for p in self.policies], upstream)
        for p in self.policies:
            routes.set_version(p.name, p.version)
        return routes

    def versions(self) -> dict[str, str | None]:
        return {p.name: p.version for p in self.policies}

    # -- a step ---------------------------------------------------------------------------
    def served(self, t: Transition) -> Policy | None:
        """The policy that served ``t``: in a run of one policy, that one; in a run of several, the one
        the call names (the gateway recorded it), and None for a call that names none (recorded elsewhere)."""
        if len(self.policies) == 1:
            return self.policies[0]
        return next((p for p in self.policies if p.name == t.policy), None)

    def learner(self, t: Transition) -> Policy | None:
        """The trained policy that learns from ``t`` (its call, of its agents), or None."""
        p = self.served(t)
        return p if p is not None and p.config.train and p.trains_on(t) else None

    def split(self, transitions: list[Transition], *, per_rollout: bool = False) -> dict[str, list[Transition]]:
        """Each trained policy's transitions (see :meth:`learner`); ``per_rollout``: each weighted
        1 / (the calls of its rollout that policy learns from), as ``normalize: rollout`` means."""
        mine: dict[str, list[Transition]] = {p.name: [] for p in self.trained}
        for t in transitions:
            p = self.learner(t)
            if p is not None:
                mine[p.name].append(t)
        if per_rollout:
            mine = {name: weighted_per_rollout(ts) for name, ts in mine.items()}
        return mine

    def metric(self, policy: Policy, key: str) -> str:
        return f"policy/{policy.name}/{key}" if self.prefixed else key

    def save_checkpoints(self, directory: Path) -> None:
        for p, backend in self.backends:
            backend.save_checkpoint(directory / p.name if self.prefixed else directory)

    def load_checkpoints(self, directory: Path) -> None:
        for p, backend in self.backends:
            backend.load_checkpoint(directory / p.name if self.prefixed else directory)
