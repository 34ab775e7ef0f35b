"""Policies as a run's config gives them: which weights answer which calls, and which calls train which weights.

A run of several agents (roles) may give each its own policy: its own LoRA adapter,
optimizer and published versions, or fixed weights that never train. Agents choose a
policy by the ``model`` they ask for, as multi-agent programs commonly give each role its
own model name:

.. code-block:: yaml

    policies:
      - {name: actor, models: [sql-writer]}                 # trained on its calls
      - {name: checker, models: [sql-checker], train: false} # the base model, frozen

The gateway routes each call to the policy its requested model names
(:class:`agl_trainer.policy_routes.Routes`) and records the policy and its version on the
call; the trainer builds each policy's transitions from its own calls, and gives every
trained policy a backend of its own (:mod:`agl_trainer.policy_backends`). A run that names
no policy has one, ``default``, that serves every model name: today's single adapter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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
