"""The records the join works on: what a reader gives the builder of each call, span, reward and step."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from agl.schema import Reward


@dataclass(slots=True)
class _Call:
    call_id: str
    seq: int
    time: float
    model_version: str | None
    prompt_ids: array
    response_ids: array
    logprobs: array | None
    request: dict | None = None  # decoded only when needed
    response: dict | None = None


@dataclass(slots=True)
class _LlmSpan:
    span_id: str
    seq: int
    time: float
    response_id: str | None
    agent: str | None
    input_messages: Any = None  # decoded only when needed
    output_messages: Any = None
    loaded: bool = False


@dataclass(slots=True)
class _Step:
    time: float
    call: _Call | None
    span: _LlmSpan | None
    agent: str | None  # the span's agent (None without a span), kept here so the hot loops read one attribute


def _step(time: float, call: _Call | None, span: _LlmSpan | None) -> _Step:
    return _Step(time, call, span, None if span is None else span.agent)


@dataclass(slots=True)
class _Reward:
    """The fields of a stored reward the build reads (duck-types :class:`~agl.schema.Reward`)."""

    reward_id: str
    name: str
    value: float
    source: str
    created_at: float


@dataclass
class _Chunk:
    calls: dict[str, list[_Call]]
    spans: dict[str, list[_LlmSpan]]
    rewards: dict[str, list[Reward | _Reward]]
