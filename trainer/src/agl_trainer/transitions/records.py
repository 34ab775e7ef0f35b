"""The records the join works on: what a reader gives the builder of each call, span, reward and step.

They are lighter than the schema's models (:class:`~agl.schema.LLMCall`,
:class:`~agl.schema.Span`, :class:`~agl.schema.Reward`): only the fields a build
reads, token ids as :class:`array.array`, and the bulky JSON (requests, messages)
left undecoded until a reader's ``load_calls`` / ``load_span`` fills it in.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from agl.schema import Reward


@dataclass(slots=True)
class CallRecord:
    """A gateway record (:class:`~agl.schema.LLMCall`) as the join reads it."""

    call_id: str
    seq: int
    time: float
    """When the gateway recorded the call (``LLMCall.created_at``)."""
    model_version: str | None
    prompt_ids: array
    response_ids: array
    """Empty for an aborted call (its client went away)."""
    logprobs: array | None
    request: dict | None = None
    """The request body; None until the reader's ``load_calls`` decodes it."""
    response: dict | None = None
    """The response body; None until the reader's ``load_calls`` decodes it."""
    behaviour: array | None = None
    """Each response token's log-prob as sampled (``LLMCall.behaviour_logprobs``), where recorded."""
    policy: str | None = None
    """The policy that served the call (``LLMCall.policy``)."""


@dataclass(slots=True)
class SpanRecord:
    """A framework's LLM span (kind ``llm``) as the join reads it."""

    span_id: str
    seq: int
    time: float
    """The span's end (its start where it has no end)."""
    response_id: str | None
    """``gen_ai.response.id``: the gateway's ``call_id`` when the call went through the gateway."""
    agent: str | None
    """``gen_ai.agent.name``."""
    input_messages: Any = None
    """``gen_ai.input.messages``; filled by the reader's ``load_span`` unless ``loaded``."""
    output_messages: Any = None
    """``gen_ai.output.messages``; filled by the reader's ``load_span`` unless ``loaded``."""
    loaded: bool = False
    """Whether the messages are read already."""


@dataclass(slots=True)
class Step:
    """One joined step of a rollout: a call with its span, a call alone, or a span alone (text-only)."""

    time: float
    call: CallRecord | None
    """The gateway record; None for a text-only step."""
    span: SpanRecord | None
    """The span; None for a gateway-only step."""
    agent: str | None
    """The span's agent (None without a span), kept here so the hot loops read one attribute."""


def make_step(time: float, call: CallRecord | None, span: SpanRecord | None) -> Step:
    """A :class:`Step` of ``call`` and ``span``, its agent the span's."""
    return Step(time, call, span, None if span is None else span.agent)


@dataclass(slots=True)
class RewardRecord:
    """The fields of a stored reward the build reads (duck-types :class:`~agl.schema.Reward`)."""

    reward_id: str
    name: str
    value: float
    source: str
    created_at: float


AnyReward = Reward | RewardRecord
"""A reward as a reader gives it: the schema's model (generic reader) or its build fields (SQL reader)."""


@dataclass
class Chunk:
    """The records of a chunk of rollouts, each kind grouped by rollout id (a rollout with none is absent)."""

    calls: dict[str, list[CallRecord]]
    spans: dict[str, list[SpanRecord]]
    rewards: dict[str, list[AnyReward]]
