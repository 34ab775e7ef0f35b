"""The request bodies and query filters of the store server's routes (:mod:`agl_trainer.store_server`).

Every one refuses fields it does not know and NaN or infinity, so that a 422 names the bad field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agl.schema import INT64_MAX, INT64_MIN, JSON, LLMCall, Reward, Rollout, RolloutStatus, Span, Task


class Body(BaseModel):
    """What every body and query filter shares."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TasksBody(Body):
    tasks: list[Task]


class RolloutsBody(Body):
    rollouts: list[Rollout]


class SpansBody(Body):
    spans: list[Span]


class LLMCallsBody(Body):
    llm_calls: list[LLMCall]


class RewardsBody(Body):
    rewards: list[Reward]


class ClaimBody(Body):
    runner_id: str = Field(min_length=1)
    limit: int = Field(default=1, ge=1, le=10_000)
    claim_id: str | None = None


class FinishBody(Body):
    status: RolloutStatus
    error: str | None = None
    output: JSON = None
    attempt: int | None = Field(default=None, ge=1, le=INT64_MAX)


class FinishItem(FinishBody):
    rollout_id: str = Field(min_length=1)


class HeartbeatBody(Body):
    runner_id: str = Field(min_length=1)
    rollout_ids: list[str]


class CancelBody(Body):
    rollout_ids: list[str]


class ExpireBody(Body):
    heartbeat_timeout_s: float = Field(gt=0)
    now: float | None = None


class BatchBody(Body):
    spans: list[Span] = Field(default_factory=list)
    llm_calls: list[LLMCall] = Field(default_factory=list)
    rewards: list[Reward] = Field(default_factory=list)
    claims: list[ClaimBody] = Field(default_factory=list)
    finishes: list[FinishItem] = Field(default_factory=list)


class StepRecordBody(Body):
    run_id: str = Field(min_length=1)
    record: dict[str, JSON]


class TaskQuery(Body):
    split: str | None = None


class RolloutQuery(Body):
    task_id: str | None = None
    status: list[RolloutStatus] | None = None
    step: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    since: float | None = None
    until: float | None = None
    rollout_ids: list[str] | None = None


class _ObservationQuery(Body):
    rollout_id: str | None = None
    rollout_ids: list[str] | None = None
    production: bool = False


class SpanQuery(_ObservationQuery):
    kind: Literal["llm", "tool", "agent", "reward", "custom"] | None = None
    since: float | None = None
    until: float | None = None


class LLMCallQuery(_ObservationQuery):
    call_ids: list[str] | None = None


class RewardQuery(_ObservationQuery):
    pass
