"""The ``apo`` backend's settings (``backend.config`` of the trainer config), checked field by field.

.. code-block:: yaml

    backend:
      name: apo
      config:
        optimizer: {base_url: https://api.openai.com/v1, model: gpt-4.1-mini, api_key_env: OPENAI_API_KEY}
        # or {engine: true}: the run's own engine writes the critiques and the rewrites
        methods: [textual_gradient, bootstrap_demos]
        resource: system_prompt      # the text resource rewritten
        demos_resource: few_shot     # the list resource demonstrations go to
        beam_width: 2
        candidates_per_step: 2
        val_batch_size: 8
        max_demos: 3
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agl.errors import ConfigError
from agl_trainer.config import unknown_key

Method = Literal["textual_gradient", "bootstrap_demos"]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OptimizerSettings(_Settings):
    """The model that writes critiques and rewritten prompts: an OpenAI-compatible endpoint, or the run's engine."""

    base_url: str | None = Field(default=None, description="an OpenAI-compatible endpoint (ends in /v1)")
    model: str | None = Field(default=None, description="its model name (with engine: the first the engine lists)")
    api_key: str | None = Field(default=None, description="its key (or api_key_env)")
    api_key_env: str | None = Field(default=None, description="the environment variable holding its key")
    engine: bool = Field(
        default=False,
        description="true: the run's own engine, called directly (not through the gateway: its calls are no rollout's)",
    )
    temperature: float = Field(default=0.7, ge=0)
    max_tokens: int = Field(default=512, ge=1, description="per optimizer answer")
    timeout_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _one_endpoint(self) -> OptimizerSettings:
        if self.engine and self.base_url:
            raise ValueError("give base_url or engine: true, not both")
        if not self.engine and not self.base_url:
            raise ValueError("give base_url (an OpenAI-compatible endpoint) or engine: true (the run's own engine)")
        if self.base_url and not self.model:
            raise ValueError("model: needed with base_url")
        if self.api_key and self.api_key_env:
            raise ValueError("give api_key or api_key_env, not both")
        return self

    def key(self) -> str:
        """The api key: ``api_key``, else ``$api_key_env`` (a ConfigError naming it when unset), else a placeholder."""
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ConfigError(f"backend.config.optimizer.api_key_env: ${self.api_key_env} is not set")
            return value
        return self.api_key or "agl"


class ApoSettings(_Settings):
    """What the ``apo`` backend searches and how widely."""

    optimizer: OptimizerSettings | None = Field(default=None, description="needed for textual_gradient")
    methods: list[Method] = Field(default_factory=lambda: ["textual_gradient"], min_length=1)
    resource: str = Field(default="system_prompt", min_length=1, description="the text resource rewritten")
    demos_resource: str = Field(default="few_shot", min_length=1, description="the list resource demos go to")
    beam_width: int = Field(default=2, ge=1, description="candidates kept after each step")
    candidates_per_step: int = Field(default=2, ge=1, description="new candidates per method per step")
    val_batch_size: int = Field(default=8, ge=1, description="tasks each candidate is scored on")
    max_demos: int = Field(default=3, ge=1, description="demonstrations in a candidate at most")
    failures_shown: int = Field(default=3, ge=1, description="low-reward rollouts the critique reads")
    max_text_chars: int = Field(default=600, ge=50, description="each message or response shown is cut to this")
    seed: int = 0

    @field_validator("methods")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        twice = sorted({m for m in value if value.count(m) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} given more than once")
        return value

    @model_validator(mode="after")
    def _optimizer_for_gradients(self) -> ApoSettings:
        if "textual_gradient" in self.methods and self.optimizer is None:
            raise ValueError("optimizer: needed for textual_gradient (base_url and model, or engine: true)")
        if self.resource == self.demos_resource:
            raise ValueError("demos_resource: must differ from resource")
        return self


def parse_settings(config: dict[str, Any]) -> ApoSettings:
    """Validate ``backend.config``; a ConfigError names each bad field (``backend.config.<field>: <reason>``)."""
    try:
        return ApoSettings.model_validate(config)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in ("backend", "config", *err["loc"]))
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":  # with the setting it most likely meant
                message = unknown_key(ApoSettings, err["loc"]).replace("config key", "setting of apo")
            lines.append(f"{where}: {message}")
        raise ConfigError("; ".join(lines)) from None


__all__ = ["ApoSettings", "Method", "OptimizerSettings", "parse_settings"]
