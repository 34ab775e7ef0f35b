"""Turning an engine's answer into :class:`~agl.schema.LLMCall` records.

Records go to a :class:`~agl.capture.BufferedWriter`, so serving a request never
waits on the store. A request with ``n > 1`` yields one record per choice, with
call ids ``<response id>-<choice index>`` and a response holding that choice only;
with ``n == 1`` the call id is the response id the client received.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from agl.capture.writer import BufferedWriter
from agl.schema import LLMCall
from agl_trainer.gateway.errors import GatewayError

log = logging.getLogger(__name__)

LOGPROB_FLOOR = -9999.0
"""What ``-Infinity`` (or a missing logprob) in an engine's answer becomes (vLLM's own floor for
logprobs): a stored logprob is always finite."""

TOKEN_ID_EXTRAS = ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params")


@dataclass(slots=True)
class CallMeta:
    """What the gateway knows of a call before the engine answers."""

    call_id: str
    rollout_id: str | None
    seqs: list[int]
    endpoint: str
    requested_model: str | None
    request: dict[str, Any]
    max_response_tokens: int | None = None
    seed: int | None = None  # the sampling seed the gateway derived from the rollout's, if any
    policy: str | None = None
    """The policy the call was routed to (a run that names its policies), else None."""
    policy_version: str | None = None
    """That policy's version when the call was routed."""
    upstream_model: str | None = None
    """The ``model`` the engine is asked for (the policy's); None: the one it serves by default."""
    started: float = field(default_factory=time.perf_counter)
    request_checked: bool = False
    """``request`` passed :func:`agl_trainer.gateway.validate.check_body` (the JSON check a record's
    ``request`` gets) and has not changed since: the record takes it without walking it again."""


@dataclass(slots=True)
class ChoiceTokens:
    """The ids and logprobs the engine sampled for one choice."""

    index: int
    ids: list[int]
    logprobs: list[float] | None
    behaviour: list[float] | None = None
    """each token's log-prob under the distribution it was sampled from, where the engine gave them"""


def no_ids_error(what: str) -> GatewayError:
    return GatewayError(
        502,
        f"the engine returned no {what}: it must speak vLLM's token-id dialect "
        "(return_token_ids=true on /v1/chat/completions and /v1/completions)",
        type="upstream_error",
        code="engine_without_token_ids",
    )


def chat_logprobs(choice: dict) -> list[float] | None:
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if content is None:
        return None
    return [LOGPROB_FLOOR if item["logprob"] is None else item["logprob"] for item in content]


def completion_logprobs(choice: dict) -> list[float] | None:
    lp = choice.get("logprobs")
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    return None if values is None else [LOGPROB_FLOOR if v is None else v for v in values]


class Recorder:
    """Builds call records and hands them to the writer."""

    def __init__(self, writer: BufferedWriter, engine_logprobs: Literal["raw", "behaviour"] = "raw"):
        self.writer = writer
        self.engine_logprobs = engine_logprobs
        """What the engine's ``logprobs`` are (see :attr:`agl_trainer.engine.Engine.logprobs_kind`)."""
        self.model_version: str | None = None
        self.recorded = 0

    def version_for(self, answer: dict, meta: CallMeta | None = None) -> str | None:
        """The model version a call is recorded with and its client is told (``model_version`` of
        the answer): its policy's version when the call was routed to one, else the gateway's own
        when set (``--model-version``, or the trainer's latest), else the one the engine's answer
        names (agl's engines name theirs), else None."""
        if meta is not None and meta.policy_version is not None:
            return meta.policy_version
        if self.model_version is not None:
            return self.model_version
        named = answer.get("model_version")
        return named if isinstance(named, str) else None

    def tell(self, answer: dict, meta: CallMeta | None = None) -> None:
        """Set ``answer``'s ``model_version`` to :meth:`version_for` (removed when there is none),
        so the client reads the version the record holds."""
        version = self.version_for(answer, meta)
        if version is None:
            answer.pop("model_version", None)
        else:
            answer["model_version"] = version

    def record(self, meta: CallMeta, prompt_ids: list[int], choices: list[ChoiceTokens], response: dict) -> None:
        """Record one call (or one per choice when there are several)."""
        latency = time.perf_counter() - meta.started
        version = self.version_for(response, meta)
        single = len(choices) == 1
        for k, choice in enumerate(choices):
            if single:
                call_id, body = meta.call_id, response
            else:
                call_id = f"{meta.call_id}-{choice.index}"
                choices = [c for c in response.get("choices", []) if c.get("index") == choice.index]
                body = dict(response, choices=choices)
            logprobs, behaviour = choice.logprobs, choice.behaviour
            if self.engine_logprobs == "behaviour" and behaviour is None:
                logprobs, behaviour = None, logprobs
            logprobs = _aligned(logprobs, choice.ids, call_id, "logprobs")
            behaviour = _aligned(behaviour, choice.ids, call_id, "behaviour_logprobs")
            self.writer.put(
                _call(
                    meta,
                    call_id=call_id,
                    seq=meta.seqs[k] if k < len(meta.seqs) else meta.seqs[-1],
                    response=body,
                    prompt_ids=prompt_ids,
                    response_ids=choice.ids,
                    response_logprobs=logprobs,
                    behaviour_logprobs=behaviour,
                    model_version=version,
                    latency_s=latency,
                )
            )
            self.recorded += 1

    def record_aborted(self, meta: CallMeta, reason: str = "client_disconnected") -> None:
        """Record a call whose client went away before its answer was complete.

        The engine request has been cancelled; the record keeps the request and no
        token ids (``aborted=True``), so transitions leave it out and count it.
        """
        latency = time.perf_counter() - meta.started
        self.writer.put(
            _call(
                meta,
                call_id=meta.call_id,
                seq=meta.seqs[0] if meta.seqs else 0,
                response={"id": meta.call_id, "aborted": True, "reason": reason},
                prompt_ids=[],
                response_ids=[],
                model_version=meta.policy_version or self.model_version,
                latency_s=latency,
                aborted=True,
            )
        )
        self.recorded += 1


def _call(meta: CallMeta, **fields: Any) -> LLMCall:
    """The record of ``meta``'s call, validated as :class:`~agl.schema.LLMCall` validates any.

    A request the gateway checked on arrival (``meta.request_checked``) is set after validation
    rather than walked a second time: the check was the same (finite numbers, 64-bit integers,
    bounded depth), and the record's model does not validate assignments.
    """
    common = {
        "rollout_id": meta.rollout_id,
        "endpoint": meta.endpoint,
        "requested_model": meta.requested_model,
        "policy": meta.policy,
        "max_response_tokens": meta.max_response_tokens,
    }
    if not meta.request_checked:
        return LLMCall(request=meta.request, **common, **fields)
    call = LLMCall(**common, **fields)
    call.request = meta.request
    return call


def _aligned(values: list[float] | None, ids: list[int], call_id: str, what: str) -> list[float] | None:
    """``values`` where there is one per response id; otherwise None, said in the log."""
    if values is None or len(values) == len(ids):
        return values
    log.warning(
        "gateway: %s has %d %s for %d response ids; recording the ids without them",
        call_id,
        len(values),
        what,
        len(ids),
    )
    return None
