"""The unified data interface: what runners, the gateway and trainers exchange.

Every model here crosses process boundaries, so each one round-trips through JSON
and through every store backend unchanged. Token arrays are packed (see
:mod:`agl.tokens`).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import threading
import time
from enum import Enum
from typing import Annotated, Any, Literal, NoReturn

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from ulid import LaxMonotonicPolicy, ULIDGenerator

from agl.tokens import Logprobs, TokenIds, stored

MAX_JSON_DEPTH = 64
"""How deeply the free-form JSON of a model (attributes, inputs, outputs, requests) may nest."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The integers every store backend can hold."""


_TOO_DEEP = f"nests deeper than {MAX_JSON_DEPTH} levels"


def _json_problem(value: Any, depth: int) -> tuple[tuple[Any, ...], str] | None:
    """``(path, reason)`` of the first part of ``value`` that is not bounded, finite JSON, or None."""
    kind = type(value)
    if kind is dict:
        items: Any = value.items()
    elif kind is list or kind is tuple:
        items = enumerate(value)
    else:
        return _scalar_problem(value)
    if depth >= MAX_JSON_DEPTH:
        return (), _TOO_DEEP
    for key, item in items:
        kind = type(item)
        # scalars are looked at here, containers one call down: one call per container, not per value
        if kind is str or kind is bool or item is None:
            continue
        if kind is float:
            if item - item == 0.0:  # finite: inf - inf and nan - nan are nan
                continue
            problem: tuple[tuple[Any, ...], str] | None = _scalar_problem(item)
        elif kind is int:
            if INT64_MIN <= item <= INT64_MAX:
                continue
            problem = _scalar_problem(item)
        else:
            problem = _json_problem(item, depth + 1)
        if problem is not None:
            # too deep is said of the whole value: a path of 64 steps helps no one
            return problem if problem[1] is _TOO_DEEP else ((key, *problem[0]), problem[1])
    return None


def _scalar_problem(value: Any) -> tuple[tuple[Any, ...], str] | None:
    kind = type(value)
    if kind is float:
        return None if math.isfinite(value) else ((), f"must be a finite number, got {value}")
    if kind is int:
        return None if INT64_MIN <= value <= INT64_MAX else ((), "integer out of the 64-bit range")
    return None  # str, bool, None; other Python objects: serialisation decides


def check_json(value: Any, field: str = "value") -> Any:
    """``value`` itself if it is JSON a store can keep: finite numbers, integers within 64 bits,
    nested at most :data:`MAX_JSON_DEPTH` deep. Otherwise a ``ValueError`` naming ``field`` and
    the path within it, e.g. ``output.scores[2]: must be a finite number, got nan``."""
    problem = _json_problem(value, 0)
    if problem is not None:
        raise ValueError(f"{field}{_path(problem[0])}: {problem[1]}")
    return value


def json_problem(value: Any) -> tuple[str, str] | None:
    """``(path, reason)`` for the first part of ``value`` :func:`check_json` would refuse
    (``path`` like ``messages[2].content``, empty for ``value`` itself), or None."""
    problem = _json_problem(value, 0)
    return None if problem is None else (_path(problem[0]).lstrip("."), problem[1])


def _path(parts: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _valid_json(value: Any, info: ValidationInfo) -> Any:
    if stored(info):  # checked when the store wrote it
        return value
    problem = _json_problem(value, 0)
    if problem is not None:
        where = _path(problem[0])
        # ``path`` continues the error's location (the store server adds it to ``field``)
        template = "at {where}: {reason}" if where else "{reason}"
        raise PydanticCustomError(
            "json_value", template, {"path": where, "where": where.lstrip("."), "reason": problem[1]}
        )
    return value


JSON = Annotated[Any, AfterValidator(_valid_json)]
"""Any JSON-serialisable value; in a model, one that is finite, within 64-bit integers and
at most :data:`MAX_JSON_DEPTH` deep (a ``ValidationError`` names the field otherwise). A record
validated with the context :data:`agl.tokens.STORED` (what a store reads back of its own) is not walked again."""
JSONObject = Annotated[dict[str, Any], AfterValidator(_valid_json)]
"""A JSON object, checked as :data:`JSON` in one pass (not once per value)."""


class _IdClock:
    """Time-ordered ids from a monotonic ULID generator (python-ulid), strictly increasing within a process.

    The clock is read under one lock with the generation, so ids from concurrent threads
    still come out in order, and a clock that steps back keeps the last millisecond.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = 0
        self._generator = ULIDGenerator(policy=LaxMonotonicPolicy())

    def next(self) -> str:
        with self._lock:
            self._ms = max(self._ms, time.time_ns() // 1_000_000)
            return self._generator.generate(self._ms).bytes.hex()


_ID_CLOCK = _IdClock()


def _restart_id_clock() -> None:
    """Give a forked child its own generator, so it never repeats its parent's next ids."""
    global _ID_CLOCK
    _ID_CLOCK = _IdClock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_id_clock)


def new_id(prefix: str = "") -> str:
    """A fresh identifier, optionally prefixed (``ro-…``, ``rw-…``): a ULID as 32 hex characters.

    12 hex digits of milliseconds since the epoch, then 80 bits that start at random each
    millisecond and count up within it, so ids made by one process sort in the order they
    were made, and ids from different processes differ in their random start. The store's
    indexes therefore grow at their end instead of being written at random pages. The
    leading characters are the clock, not randomness: use :func:`short_id` for a short
    unique tag, never a prefix of this.
    """
    return prefix + _ID_CLOCK.next()


def short_id(length: int = 8) -> str:
    """A short random tag (``length`` hex characters), e.g. to tell runner processes apart."""
    return secrets.token_hex((length + 1) // 2)[:length]


def now() -> float:
    """Wall-clock time in seconds since the epoch, the unit of every timestamp here."""
    return time.time()


class _Model(BaseModel):
    # No NaN or infinity in any float field: SQL stores NaN as NULL and JSON has neither.
    # defer_build: each model's validator is built when first used, so an agent's process that
    # only captures spans builds Span's and Reward's, not the training side's (Transition, ...).
    model_config = ConfigDict(
        extra="forbid", validate_assignment=False, defer_build=True, ser_json_inf_nan="constants", allow_inf_nan=False
    )


class Task(_Model):
    """One input of a dataset. Rollouts of the same task form a group.

    The dataset's fields are in ``input``: a reward reads ``rollout.task.input["answer"]``.
    A task is not a mapping itself (its input may be any JSON, and ``task_id`` is not part
    of it), so ``task["answer"]`` is a ``TypeError`` that says what to write instead.
    """

    task_id: str = Field(default_factory=lambda: new_id("task-"), min_length=1)
    """The task's id, made up (``task-…``) when not given."""
    input: JSON
    """The dataset's fields for this task, any JSON: what the agent receives."""
    split: str = "train"
    """Which split the task belongs to (``train``, ``val``, or a name of your own)."""
    metadata: JSONObject = Field(default_factory=dict)
    """Anything else to keep with the task; agl does not read it."""

    def __getitem__(self, key: object) -> NoReturn:
        if isinstance(key, str) and key in type(self).model_fields:
            hint = f"write task.{key}"
        else:
            hint = f"the dataset's fields are in task.input: write rollout.task.input[{key!r}]"
        raise TypeError(f"'Task' object is not subscriptable; {hint}")


class RolloutStatus(str, Enum):
    """Where a rollout is in its life: queued → running → one of the terminal states."""

    QUEUED = "queued"
    """Waiting for a runner to claim it."""
    RUNNING = "running"
    """Claimed: an attempt is running."""
    SUCCEEDED = "succeeded"
    """The agent returned."""
    FAILED = "failed"
    """Its last attempt failed (the agent raised, say) and no attempt is left."""
    TIMED_OUT = "timed_out"
    """An attempt ran past the rollout's timeout, and no attempt is left."""
    CANCELLED = "cancelled"
    """Cancelled before it ended."""

    @property
    def terminal(self) -> bool:
        """Whether the rollout has ended (succeeded, failed, timed out or cancelled)."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMED_OUT, RolloutStatus.CANCELLED}
)

ALLOWED_TRANSITIONS: dict[RolloutStatus, frozenset[RolloutStatus]] = {
    RolloutStatus.QUEUED: frozenset({RolloutStatus.RUNNING, RolloutStatus.CANCELLED}),
    # running → queued is a retry: the attempt failed and the policy allows another.
    RolloutStatus.RUNNING: frozenset(TERMINAL_STATUSES | {RolloutStatus.QUEUED}),
    RolloutStatus.SUCCEEDED: frozenset(),
    RolloutStatus.FAILED: frozenset(),
    RolloutStatus.TIMED_OUT: frozenset(),
    RolloutStatus.CANCELLED: frozenset(),
}


class Rollout(_Model):
    """One run of the agent on one task."""

    rollout_id: str = Field(default_factory=lambda: new_id("ro-"), min_length=1)
    """The rollout's id, made up (``ro-…``) when not given."""
    task_id: str = Field(min_length=1)
    """The task the rollout runs."""
    status: RolloutStatus = RolloutStatus.QUEUED
    """Where the rollout is in its life (:class:`RolloutStatus`)."""
    attempt: int = Field(default=0, ge=0, le=INT64_MAX, description="attempts started so far")
    max_attempts: int = Field(default=1, ge=1, le=INT64_MAX)
    """How many attempts the rollout may have: a failed or timed-out one is retried until this many were started."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Seconds an attempt may run before it counts as timed out; None: no limit of its own."""
    max_response_tokens: int | None = Field(
        default=None,
        ge=1,
        le=INT64_MAX,
        description="the gateway ends every response of this rollout after this many tokens, "
        "whatever the client asked for (None: no cap beyond the client's own and the context)",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        lt=2**63,
        description="sampling seed: the gateway gives each call of the rollout a seed derived from it and the "
        "call's position, where the client set none, so a run's sampling does not depend on scheduling",
    )
    model_version: str | None = None
    """The model version current when it was enqueued; transitions fall back to it for calls that recorded none."""
    step: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX, description="training step that enqueued it")
    mode: Literal["train", "val", "production"] = "train"
    """What the rollout is for: ``train``, ``val`` (evaluation) or ``production`` (traffic outside training)."""
    runner_id: str | None = None
    """The runner that claimed the current attempt (None while queued)."""
    claim_id: str | None = None
    """The id of the claim that took the current attempt, so a repeated claim gets the same rollouts back."""
    created_at: float = Field(default_factory=now)
    """When the rollout was enqueued (epoch seconds)."""
    started_at: float | None = None
    """When its current attempt was claimed (epoch seconds)."""
    heartbeat_at: float | None = None
    """When its runner was last heard from (epoch seconds)."""
    ended_at: float | None = None
    """When it reached a terminal status (epoch seconds)."""
    error: str | None = None
    """Why its last attempt failed, if it did."""
    output: JSON = None
    """What the agent returned (JSON; a value JSON cannot hold is stored as its repr)."""
    task: Task | None = Field(default=None, description="the task, filled in when claimed")
    resources: JSONObject = Field(
        default_factory=dict,
        description="named resources (prompts, few-shot examples) the rollout runs with: the runner merges them "
        "over its own into ctx.resources; an algorithm that changes prompts (agl-apo) sets them",
    )
    resources_version: str | None = Field(default=None, description="the version of those resources")


class Attempt(_Model):
    """One try at running a rollout; a rollout retried by policy has several."""

    rollout_id: str
    """The rollout this is an attempt of."""
    attempt: int = Field(ge=1, le=INT64_MAX)
    """Its number: 1 for the first try, then 2, 3…"""
    runner_id: str | None = None
    """The runner that ran it."""
    status: RolloutStatus = RolloutStatus.RUNNING
    """How it ended, or ``running``."""
    started_at: float = Field(default_factory=now)
    """When it was claimed (epoch seconds)."""
    ended_at: float | None = None
    """When it ended (epoch seconds); None while running."""
    error: str | None = None
    """Why it failed, if it did."""
    heartbeat_at: float | None = Field(
        default=None, description="when its runner was last heard from (the claim counts); None if never recorded"
    )


SpanKind = Literal["llm", "tool", "agent", "reward", "custom"]


class Span(_Model):
    """One observed event in a rollout, OpenTelemetry-shaped.

    ``rollout_id`` is None for production traffic outside any training rollout.
    Attribute names follow the OpenTelemetry GenAI conventions where one exists
    (``gen_ai.response.id``, ``gen_ai.agent.name``) and ``agl.*`` otherwise.
    """

    span_id: str = Field(default_factory=lambda: new_id(), min_length=1)
    """The span's id (a reward may name it to reward this span)."""
    trace_id: str = Field(default_factory=lambda: new_id(), min_length=1)
    """The trace the span belongs to: every span of one rollout shares one."""
    parent_id: str | None = None
    """The span this one is nested in; None at the top."""
    rollout_id: str | None = None
    """The rollout it was recorded in; None for production traffic."""
    seq: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    """Its order among the rollout's spans (the order they were recorded in)."""
    name: str
    """What happened (a tool's name, an agent's name, ``chat.completions``…)."""
    kind: SpanKind = "custom"
    """``llm``, ``tool``, ``agent``, ``reward`` or ``custom``: what transitions are built from are the ``llm`` spans."""
    start_time: float = Field(default_factory=now)
    """When it started (epoch seconds)."""
    end_time: float | None = None
    """When it ended (epoch seconds); None while open."""
    status: Literal["ok", "error", "unset"] = "unset"
    """``ok``, ``error`` or ``unset``, as in OpenTelemetry."""
    attributes: JSONObject = Field(default_factory=dict)
    """Its attributes (GenAI conventions where one exists, ``agl.*`` otherwise), as JSON."""


def _logprobs_match_ids(value, info):
    ids = info.data.get("response_ids")
    if value is not None and ids is not None and len(value) != len(ids):
        raise ValueError(f"has {len(value)} values for {len(ids)} response ids")
    return value


class LLMCall(_Model):
    """What the gateway recorded of one model call: the token truth."""

    call_id: str = Field(min_length=1, description="the response id returned to the client")
    rollout_id: str | None = None
    """The rollout the call was made in (from its URL or key); None for production traffic."""
    seq: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    """Its order among the rollout's calls, as the gateway received them."""
    endpoint: str = "chat.completions"
    """Which API the client called, e.g. ``chat.completions``."""
    requested_model: str | None = None
    """The model name the client asked for."""
    request: JSONObject = Field(default_factory=dict)
    """The request body as the client sent it."""
    response: JSONObject = Field(default_factory=dict)
    """The response body as the client received it."""
    prompt_ids: TokenIds
    """The prompt's token ids, as the engine tokenized it."""
    response_ids: TokenIds
    """The response's token ids, as the engine generated them."""
    response_logprobs: Logprobs | None = Field(
        default=None, description="each response token's log-prob under the raw model (before temperature)"
    )
    behaviour_logprobs: Logprobs | None = Field(
        default=None,
        description="each response token's log-prob under the distribution it was sampled from (after "
        "temperature, top-p and top-k; 0 for a greedy token): what importance weights need",
    )
    model_version: str | None = None
    """The model version that served the call."""
    policy: str | None = Field(
        default=None,
        description="the policy that served the call (chosen by its requested model name); None: a run of one policy",
    )
    latency_s: float | None = None
    """Seconds from the request to the end of the response."""
    created_at: float = Field(default_factory=now)
    """When the call was recorded (epoch seconds)."""
    max_response_tokens: int | None = Field(
        default=None,
        ge=1,
        le=INT64_MAX,
        description="the rollout's response cap the gateway enforced on this call, if any",
    )
    aborted: bool = Field(
        default=False,
        description="the client went away before the answer was complete: the engine request was cancelled, "
        "response_ids is empty, and transitions leave the call out (counted)",
    )

    _check_logprobs = field_validator("response_logprobs", "behaviour_logprobs")(_logprobs_match_ids)


RETURN_SOURCE = "return"
"""The ``source`` of a reward the agent function returned (written by the runner); it outranks every other."""

ROLLOUT_REWARD_ID = re.compile(r"rw-.+-a[0-9]+-.+")
"""The form of the reward ids agl itself makes for a rollout: the runner's ``rw-<rollout>-a<attempt>-return``,
the reward plugins' ``rw-<rollout>-a<attempt>-<plugin>-<name>``. They are predictable, so a store refuses
one on a reward of another rollout, and the store server refuses them from a rollout key altogether
(:class:`~agl.errors.IdConflict`, 409 naming the id)."""

TRUSTED_SOURCES = frozenset({RETURN_SOURCE})
"""Reward sources only the runner and the trainer write. A rollout key (what an agent holds) may
write any other source (``agent`` from :func:`agl.emit_reward`, ``langchain``, ``user``…), never
these: the store server refuses them (403 naming the field), so an agent cannot outrank the
reward plugins with a reward of its own making."""

GRADER_SOURCES = frozenset({"human", "user"})
"""Reward sources that say someone other than the agent graded a rollout (``agl rollouts reward``, the
dashboard, a feedback process). Only a credential no agent holds (the admin token) writes them on a
rollout: the store server refuses them from a rollout key or a runner token (403 naming the field),
and ``from_store`` counts a rollout as graded only by a reward of one of these sources, by default."""

REWARD_LIMIT = 3.4028234663852886e38
"""The largest reward magnitude accepted: float32's largest finite value, the learners' reward dtype
(a larger one would become inf there, and the advantages of its whole group NaN)."""


class Reward(_Model):
    """A reward attached to a rollout, or to one span of it."""

    reward_id: str = Field(default_factory=lambda: new_id("rw-"), min_length=1)
    """The reward's id (writes are idempotent by it)."""
    rollout_id: str | None = None
    """The rollout it rewards; None for a production span's reward given by span id alone."""
    span_id: str | None = None
    """The span it rewards, if one (an intermediate reward); None: the rollout as a whole."""
    name: str = "reward"
    """Its name: the one named ``reward`` is the rollout's final reward, others are kept beside it."""
    value: float = Field(description="finite and within float32's range (REWARD_LIMIT)")
    source: str = "agent"
    """Who wrote it: ``agent``, ``return`` (what the agent function returned), a plugin's name, ``human``, ``user``…"""
    seq: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    """Its order among the rollout's rewards."""
    created_at: float = Field(default_factory=now)
    """When it was written (epoch seconds)."""

    @field_validator("value")
    @classmethod
    def _fits_float32(cls, value: float) -> float:
        if abs(value) > REWARD_LIMIT:
            raise ValueError(f"must be within float32's range (±3.4e38, the learners' reward dtype), got {value:g}")
        return value


class Segment(_Model):
    """One call's generated tokens inside a merged transition's response (see :attr:`Transition.segments`)."""

    start: int = Field(ge=0, description="offset of the call's first generated token in the response")
    end: int = Field(ge=1, description="offset just past its last generated token")
    step: int = Field(ge=0, le=INT64_MAX, description="the call's position within its rollout")
    call_id: str | None = None
    reward: float = Field(description="the call's reward from credit assignment")


def _segments_fit_response(value, info):
    ids = info.data.get("response_ids")
    if value is None or ids is None:
        return value
    at = 0
    for k, seg in enumerate(value):
        if seg.start < at or seg.end <= seg.start or seg.end > len(ids):
            raise ValueError(
                f"segment {k} [{seg.start}, {seg.end}) must be non-empty, after the previous one (ends at {at}) "
                f"and inside the {len(ids)} response ids"
            )
        at = seg.end
    return value


SAMPLING_KEYS = ("temperature", "top_p", "top_k")
"""The request fields that shape the distribution a call's tokens are drawn from (every API dialect
the gateway serves spells them so)."""


def sampling_of(request: dict[str, Any] | None) -> dict[str, float | int | None]:
    """The :data:`SAMPLING_KEYS` a request body sets (a key it leaves out: the engine's default)."""
    return {k: request[k] for k in SAMPLING_KEYS if request and request.get(k) is not None}


class Transition(_Model):
    """One LLM call as training data, after credit assignment."""

    rollout_id: str
    """The rollout the call was made in."""
    task_id: str
    """The rollout's task (transitions are grouped by it)."""
    step: int = Field(ge=0, le=INT64_MAX, description="position of the call within its rollout")
    agent: str | None = None
    """The agent that made the call, where the integration knew it."""
    prompt_ids: TokenIds
    """The prompt's token ids."""
    response_ids: TokenIds
    """The response's token ids (the part that is trained)."""
    response_logprobs: Logprobs | None = None
    """Each response token's log-prob under the raw model, as the gateway recorded it."""
    behaviour_logprobs: Logprobs | None = Field(
        default=None, description="the call's log-probs as sampled (see LLMCall.behaviour_logprobs)"
    )
    reward: float
    """The call's reward after credit assignment."""
    model_version: str | None = None
    """The model version that generated the response."""
    policy: str | None = Field(default=None, description="the policy that served the call (LLMCall.policy)")
    sampling: dict[str, float | int | None] | None = Field(
        default=None,
        description="the sampling settings the call asked for (SAMPLING_KEYS found in its request; a key absent: "
        "the engine's default); None: not read",
    )
    token_source: Literal["engine", "text"] = "engine"
    """``engine``: token ids the gateway recorded; ``text``: a text-only transition (text fields, no token ids)."""
    call_id: str | None = None
    """The LLM call it was built from (its response id)."""
    weight: float = Field(default=1.0, ge=0, description="loss weight (rollout-level normalization)")
    prompt_messages: list[dict[str, JSON]] | None = Field(
        default=None, description="the prompt as chat messages (text-only transitions, SFT export)"
    )
    response_text: str | None = Field(
        default=None, description="the response as text (text-only transitions, SFT export)"
    )
    segments: list[Segment] | None = Field(
        default=None,
        description="a merged transition (several calls in one sequence): each call's generated part of the "
        "response; the tokens between them (tool results, new turns) are context, not trained. None: one call, "
        "the whole response generated",
    )

    _check_logprobs = field_validator("response_logprobs", "behaviour_logprobs")(_logprobs_match_ids)
    _check_segments = field_validator("segments")(_segments_fit_response)


class ModelVersion(_Model):
    """A set of weights (or an adapter) an engine can serve."""

    version: str = Field(min_length=1)
    """The version's name (what calls and rollouts record)."""
    path: str | None = Field(default=None, description="the weights or adapter; None: the base model's own weights")
    base_model: str | None = None
    """The base model the weights or adapter belong to."""
    policy: str | None = Field(
        default=None, description="the policy these weights are for (see TrainerConfig.policies); None: the only one"
    )
    step: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    """The training step that produced it; None for weights not trained by this run."""
    created_at: float = Field(default_factory=now)
    """When it was registered (epoch seconds)."""
    metadata: JSONObject = Field(default_factory=dict)
    """Anything else to keep with it; agl does not read it."""


class StoreStats(_Model):
    """Counts a store reports about what it holds."""

    tasks: int = 0
    rollouts: dict[str, int] = Field(default_factory=dict)
    spans: int = 0
    llm_calls: int = 0
    rewards: int = 0
    model_versions: int = 0
