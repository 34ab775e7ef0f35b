"""How a SQL store's rows and records turn into each other: rollout rows, JSON bodies."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from agl.schema import Rollout
from agl.tokens import STORED

ROLLOUT_COLUMNS = (
    "rollout_id",
    "task_id",
    "status",
    "attempt",
    "max_attempts",
    "timeout_s",
    "model_version",
    "step",
    "mode",
    "runner_id",
    "claim_id",
    "created_at",
    "started_at",
    "heartbeat_at",
    "ended_at",
    "error",
    "output",
    "max_response_tokens",
    "seed",
    "resources",
    "resources_version",
)
ROLLOUT_SELECT = ", ".join(ROLLOUT_COLUMNS)
NULL = "null"  # the JSON text of None, what an output column holds for no output

_TOKEN_FIELDS = frozenset({"prompt_ids", "response_ids", "response_logprobs", "behaviour_logprobs"})
TOKEN_EXCLUDE = set(_TOKEN_FIELDS)  # pydantic takes a set as it is (a frozenset it converts on every call)


def json_body(model: BaseModel, exclude: set[str] | None = None) -> str:
    """``model.model_dump_json(exclude=exclude)``, without its per-call wrapper (the same text)."""
    return model.__pydantic_serializer__.to_json(model, exclude=exclude).decode()


def json_text(value: Any) -> str:
    """Compact JSON text of a value (NaN kept, as the store's records allow it)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    """The rollout of a ``rollouts`` row read as :data:`ROLLOUT_SELECT`."""
    data = dict(zip(ROLLOUT_COLUMNS, row, strict=False))
    data["output"] = None if data["output"] is None else json.loads(data["output"])
    data["resources"] = json.loads(data["resources"]) if data["resources"] else {}
    return Rollout.model_validate(data, context=STORED)
