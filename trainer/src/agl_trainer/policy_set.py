"""The trainer's side of a run's policies: a backend per trained policy, their versions, who trains on what.

A run that names no policy, or one, keeps today's shape: one backend, the engine's default
weights, metrics without a prefix. A run of several gives each trained policy its own
backend (its own optimizer, checkpoint directory and published versions), serves every
policy as a named policy of the engine, and writes each policy's metrics as
``policy/<name>/<metric>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agl.errors import ConfigError
from agl.schema import ModelVersion, Transition
from agl_trainer.backend import Backend
from agl_trainer.engine import Engine
from agl_trainer.policies import PolicyConfig, Routes, effective_policies

BASE_VERSION = "base"
"""The version of a policy that serves the engine's model as it is."""


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
            if p.backend is not None:
                p.backend.policy = p.engine_name

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
    def split(self, transitions: list[Transition]) -> dict[str, list[Transition]]:
        """Each trained policy's transitions: its calls, of its agents.

        In a run of one policy every transition is its own. In a run of several, a transition
        names its policy (the gateway recorded it); one that names none (recorded elsewhere) trains none.
        """
        only = self.policies[0] if len(self.policies) == 1 else None
        by_name = {p.name: p for p in self.policies}
        mine: dict[str, list[Transition]] = {p.name: [] for p in self.trained}
        for t in transitions:
            p = only or by_name.get(t.policy)
            if p is not None and p.name in mine and p.trains_on(t):
                mine[p.name].append(t)
        return mine

    def metric(self, policy: Policy, key: str) -> str:
        return f"policy/{policy.name}/{key}" if self.prefixed else key

    def save_checkpoints(self, directory: Path) -> None:
        for p, backend in self.backends:
            backend.save_checkpoint(directory / p.name if self.prefixed else directory)

    def load_checkpoints(self, directory: Path) -> None:
        for p, backend in self.backends:
            backend.load_checkpoint(directory / p.name if self.prefixed else directory)
