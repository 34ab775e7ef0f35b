"""What a build is told (:class:`TransitionConfig`) and what it reports back (:class:`BuildReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TransitionConfig(BaseModel):
    """How rollouts become transitions."""

    model_config = ConfigDict(extra="forbid")

    credit: str = Field(default="broadcast", description="credit-assignment strategy (see agl_trainer.credit)")
    credit_options: dict[str, float] = Field(default_factory=dict, description="e.g. {'gamma': 0.9}")
    normalize: Literal["rollout", "none"] = Field(
        default="rollout", description="'rollout': weight = 1/calls kept per rollout; 'none': weight 1"
    )
    agents: list[str] | None = Field(default=None, description="train only these agents' calls (None: all)")
    failed_reward: float | None = Field(
        default=0.0, description="final reward of a failed/timed-out rollout with none of its own; None drops it"
    )
    missing_reward: float | None = Field(
        default=None, description="final reward of a succeeded rollout nobody rewarded; None drops it (counted)"
    )
    text_only: bool = Field(default=True, description="emit text-only transitions (spans with no gateway record)")
    with_text: bool = Field(default=False, description="fill prompt_messages/response_text on engine transitions too")
    with_sampling: bool = Field(
        default=False,
        description="fill each engine transition's sampling (the temperature, top_p, top_k its request asked for), "
        "so a backend can tell calls sampled at other settings than its own; reads each call's request",
    )
    reward_plugins: bool = Field(default=True, description="run agl_reward plugins")
    agent_rewards: Literal["without_plugin", "always"] = Field(
        default="without_plugin",
        description="rewards the agent wrote (emit_reward, LangChain events: every source but the runner's "
        "'return' and the plugins'): 'without_plugin' counts them only where no reward plugin answered for the "
        "rollout (what a rollout's own code writes cannot move a graded reward); 'always' also where one did, "
        "as intermediate rewards beside the plugin's final one",
    )
    merge: Literal["off", "prefix"] = Field(
        default="off",
        description="'prefix': a rollout's consecutive calls of one agent and model version become one training "
        "row where each call's prompt ids begin with the previous call's prompt and response ids (see "
        "agl_trainer.transitions.merge); 'off': one transition per call",
    )


@dataclass
class BuildReport:
    """What a build did, for logs and metrics. Nothing is dropped without a count here."""

    rollouts: int = 0
    transitions: int = 0
    joined_by_id: int = 0
    """Gateway calls joined to their LLM span by response id."""
    joined_by_order: int = 0
    """Gateway calls joined to an LLM span with no response id, by their messages, in order."""
    unmatched_spans: int = 0
    duplicate_spans: int = 0
    """LLM spans with the response id of a call another span joined first (two tracers of one
    call, e.g. an SDK's own spans and an instrumentation's), left out."""
    text_only: int = 0
    """LLM spans with no gateway call (their transitions carry text, no token ids)."""
    gateway_only: int = 0
    """Gateway calls no LLM span joined (unjoined: no agent name, no span messages)."""
    rollouts_without_spans: int = 0
    """Ended rollouts with gateway calls of which no LLM span joined a single one: where capture
    was on, it captured nothing for them (:mod:`agl_trainer.capture_check` says so)."""
    filtered_out: int = 0
    stale_records: int = 0
    aborted_calls: int = 0
    """Gateway records of calls whose client went away (``LLMCall.aborted``: no response ids), left out."""
    plugin_errors: int = 0
    agent_rewards_ignored: int = 0
    """Rewards the agent wrote on rollouts a reward plugin answered for, left out (``agent_rewards``)."""
    singletons_folded: int = 0
    """Rollouts alone with their task in the step, put in one group of their own (:mod:`agl_trainer.baselines`)."""
    singletons_left_out: int = 0
    """Rollouts alone with their task and with no other singleton to share a baseline with, left out."""
    merged_calls: int = 0
    """Calls that joined the previous call's row (``merge="prefix"``): transitions has that many fewer rows."""
    unmerged_tokens: int = 0
    """With ``merge="prefix"``: the prompt and response tokens the merged rollouts' calls would hand the
    learner as rows of their own (the ``learner_tokens`` metric is what it got)."""
    merge_breaks: dict[str, int] = field(default_factory=dict)
    """With ``merge="prefix"``: the calls that started a new row after a call of their rollout, by reason
    (:data:`agl_trainer.transitions.merge.BREAK_REASONS`)."""
    policy_calls: dict[str, int] = field(default_factory=dict)
    """Gateway calls by the policy that served them (``LLMCall.policy``; a run that names its policies),
    every agent's, before ``agents`` selects which train."""
    dropped_rollouts: dict[str, int] = field(default_factory=dict)
    unmatched: list[tuple[str, str]] = field(default_factory=list)
    """``(rollout_id, span_id)`` of unmatched spans (the first 100)."""
    without_spans: list[str] = field(default_factory=list)
    """Ids of rollouts counted in ``rollouts_without_spans`` (the first 100)."""

    def spanless(self, rollout_id: str) -> None:
        """Count a rollout whose gateway calls no LLM span joined."""
        self.rollouts_without_spans += 1
        if len(self.without_spans) < 100:
            self.without_spans.append(rollout_id)

    def joins(self) -> str:
        """The join counts in words: by id, by order, unjoined calls, text-only spans."""
        return (
            f"{self.joined_by_id} calls joined to their span by id, {self.joined_by_order} by order, "
            f"{self.gateway_only} unjoined (no LLM span), {self.text_only} text-only spans (no gateway call)"
            + (f", {self.unmatched_spans} unmatched spans left out" if self.unmatched_spans else "")
            + (f", {self.duplicate_spans} second spans of a joined call left out" if self.duplicate_spans else "")
        )

    def drop(self, reason: str) -> None:
        self.dropped_rollouts[reason] = self.dropped_rollouts.get(reason, 0) + 1

    def as_metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.__dict__.items() if isinstance(v, int)}
        for reason, n in self.dropped_rollouts.items():
            out[f"dropped_{reason}"] = float(n)
        for reason, n in self.merge_breaks.items():
            out[f"merge_break_{reason}"] = float(n)
        return out
