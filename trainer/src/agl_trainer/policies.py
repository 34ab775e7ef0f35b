"""Policies: which weights answer which calls, and which calls train which weights.

A run of several agents (roles) may give each its own policy: its own LoRA adapter,
optimizer and published versions, or fixed weights that never train. Agents choose a
policy by the ``model`` they ask for, as multi-agent programs commonly give each role its
own model name:

.. code-block:: yaml

    policies:
      - {name: actor, models: [sql-writer]}                 # trained on its calls
      - {name: checker, models: [sql-checker], train: false} # the base model, frozen

The gateway routes each call to the policy its requested model names (:class:`Routes`) and
records the policy and its version on the call; the trainer builds each policy's
transitions from its own calls, and gives every trained policy a backend of its own. A run
that names no policy has one, ``default``, that serves every model name: today's single
adapter.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

ANY_MODEL = "*"
"""In a policy's ``models``: every model name no other policy names."""

DEFAULT_POLICY = "default"
"""The name of the one policy of a run that names none."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class PolicyConfig(BaseModel):
    """One policy of a run (``TrainerConfig.policies``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="names the policy in metrics, checkpoints and versions (letters, digits, _ . -)")
    models: list[str] = Field(
        default_factory=lambda: [ANY_MODEL],
        min_length=1,
        description="the model names agents ask for that this policy answers ('*': every name no other policy names)",
    )
    agents: list[str] | None = Field(
        default=None,
        description="train only on the calls of these agents (within transitions.agents); None: every agent's",
    )
    train: bool = Field(default=True, description="false: the policy serves fixed weights and never trains")
    weights: str | None = Field(
        default=None,
        description="a frozen policy's weights: a LoRA adapter directory on the engine's model; None: the base model",
    )
    backend: dict = Field(
        default_factory=dict,
        description="settings of this policy's backend over backend.config (e.g. lr, lora); trained policies only",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"{value!r}: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
        return value

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str]) -> list[str]:
        if any(not isinstance(m, str) or not m for m in value):
            raise ValueError("each model name must be a non-empty string")
        return value


def check_policies(policies: Sequence[PolicyConfig]) -> None:
    """Raise ``ValueError`` naming what is wrong: a name or a model name given twice, more than one
    ``'*'``, ``weights`` on a trained policy, ``backend`` settings on a frozen one."""
    names = [p.name for p in policies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"policies: the name {twice[0]!r} is given twice")
    owner: dict[str, str] = {}
    for p in policies:
        for model in p.models:
            if model in owner:
                raise ValueError(f"policies: model {model!r} is named by both {owner[model]!r} and {p.name!r}")
            owner[model] = p.name
        if p.train and p.weights is not None:
            raise ValueError(f"policies.{p.name}.weights: only a frozen policy (train: false) serves given weights")
        if not p.train and p.backend:
            raise ValueError(f"policies.{p.name}.backend: a frozen policy has no backend")


def effective_policies(policies: Sequence[PolicyConfig]) -> list[PolicyConfig]:
    """The run's policies: those given, or the one ``default`` policy that serves every model name."""
    return list(policies) or [PolicyConfig(name=DEFAULT_POLICY)]


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
