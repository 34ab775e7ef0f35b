"""The gateway's table of a run's policies: which policy answers a requested model name, at which version.

Built from the policies' config (:mod:`agl_trainer.policy_config`); the trainer sets each
policy's version (and the engine model that serves it) as it publishes, while the gateway
routes calls from its own threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from agl_trainer.policy_config import ANY_MODEL, PolicyConfig, check_policies


@dataclass(frozen=True, slots=True)
class Route:
    """Where a call goes: its policy, the ``model`` the engine is asked for, the version recorded."""

    policy: str
    upstream_model: str | None
    """None: the model the engine serves by default (what it lists first)."""
    version: str | None


class UnknownModel(LookupError):
    """No policy answers this model name."""

    def __init__(self, model: str | None, policies: Sequence[str]):
        self.model = model
        self.policies = list(policies)
        super().__init__(f"model {model!r} is answered by no policy of this run (policies: {', '.join(policies)})")


class Routes:
    """The gateway's table of policies: model name -> policy, and each policy's engine model and version.

    Thread-safe: the trainer sets a policy's version from its thread while the gateway routes.
    """

    def __init__(self, policies: Sequence[PolicyConfig], upstream_models: dict[str, str | None]):
        check_policies(policies)
        self._by_model = {m: p.name for p in policies for m in p.models if m != ANY_MODEL}
        self._fallback = next((p.name for p in policies if ANY_MODEL in p.models), None)
        self._upstream = {p.name: upstream_models.get(p.name) for p in policies}
        self._versions: dict[str, str | None] = dict.fromkeys(self._upstream)
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        """The policies, in the order given."""
        return list(self._upstream)

    def policy_of(self, model: str | None) -> str:
        """The policy that answers ``model``; :class:`UnknownModel` when none does."""
        name = self._by_model.get(model) if model is not None else None
        name = name or self._fallback
        if name is None:
            raise UnknownModel(model, self.names)
        return name

    def route(self, model: str | None) -> Route:
        """Where a call asking for ``model`` goes."""
        name = self.policy_of(model)
        with self._lock:
            return Route(name, self._upstream[name], self._versions[name])

    def set_version(self, policy: str, version: str | None) -> None:
        """Record ``version`` on ``policy``'s calls from now on."""
        if policy not in self._upstream:
            raise KeyError(f"policy: {policy!r} is not one of {', '.join(self.names)}")
        with self._lock:
            self._versions[policy] = version

    def set_upstream(self, policy: str, model: str | None) -> None:
        """Ask the engine for ``model`` on ``policy``'s calls from now on (an engine may serve each version
        of a policy under a name of its own, as vLLM's adapters are)."""
        if policy not in self._upstream:
            raise KeyError(f"policy: {policy!r} is not one of {', '.join(self.names)}")
        with self._lock:
            self._upstream[policy] = model

    def versions(self) -> dict[str, str | None]:
        """Each policy's version now."""
        with self._lock:
            return dict(self._versions)
