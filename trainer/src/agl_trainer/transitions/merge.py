"""Merging a rollout's consecutive calls into one training sequence where their token ids extend each other.

With ``merge="prefix"`` (:class:`~agl_trainer.transitions.config.TransitionConfig`), a call joins
the row of the call before it (the previous kept call of the rollout) when both are engine calls
of one agent and one model version and its prompt ids begin with the previous call's prompt ids
followed by its response ids, exactly. The merged row keeps the first call's prompt; its response
is everything after it up to the last call's response, and :attr:`~agl.schema.Transition.segments`
marks which of those tokens each call generated and with which reward. The tokens between
segments (tool results, new user turns) are context: the learner trains on none of them.

Where a call does not extend the row, a new row starts and the reason is counted
(:data:`BREAK_REASONS`). Nothing is re-tokenized: ids that do not match exactly never merge.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from agl.schema import Segment, Transition
from agl_trainer.transitions.config import BuildReport

BREAK_REASONS = {
    "text_only": "one of the two calls has no engine token ids (a span with no gateway record)",
    "agent": "the calls are different agents'",
    "policy": "the calls were served by different policies",
    "model_version": "the calls were served by different model versions",
    "sampling": "the calls asked for different sampling settings (temperature, top_p, top_k)",
    "not_extending": "the later prompt's ids do not begin with the earlier call's prompt and response ids",
}
"""Why a call starts a new row instead of joining the previous call's, as counted in
:attr:`~agl_trainer.transitions.config.BuildReport.merge_breaks`."""

PER_TOKEN_ARRAYS = ("response_logprobs", "behaviour_logprobs")
"""The per-token arrays of a transition's response: a merged row carries each call's values at its
segment's positions and 0 in between (masked out of every loss), or None where some call has none."""


def break_reason(previous: Transition, following: Transition) -> str | None:
    """Why ``following`` cannot join the row ending with ``previous`` (a :data:`BREAK_REASONS` key); None if it can."""
    if previous.token_source != "engine" or following.token_source != "engine":
        return "text_only"
    if previous.agent != following.agent:
        return "agent"
    if previous.policy != following.policy:
        return "policy"
    if previous.model_version != following.model_version:
        return "model_version"
    if previous.sampling != following.sampling:
        return "sampling"
    if not extends(previous, following):
        return "not_extending"
    return None


def extends(previous: Transition, following: Transition) -> bool:
    """Whether ``following``'s prompt ids begin with ``previous``'s prompt ids and then its response ids."""
    prompt, response, later = previous.prompt_ids, previous.response_ids, following.prompt_ids
    n = len(prompt)
    return len(later) >= n + len(response) and later[:n] == prompt and later[n : n + len(response)] == response


def merge_prefix(transitions: Sequence[Transition], report: BuildReport) -> list[Transition]:
    """One rollout's transitions (in step order) with each run of extending calls merged into one row.

    Counts each call that joined a row (``report.merged_calls``), each break by reason, and the
    learner tokens of the rollout's calls as rows of their own (``report.unmerged_tokens``).
    """
    report.unmerged_tokens += sum(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    out: list[Transition] = []
    run: list[Transition] = []
    for t in transitions:
        if run:
            reason = break_reason(run[-1], t)
            if reason is None:
                run.append(t)
                report.merged_calls += 1
                continue
            report.merge_breaks[reason] = report.merge_breaks.get(reason, 0) + 1
            out.append(merged(run))
        run = [t]
    if run:
        out.append(merged(run))
    return out


def merged(run: Sequence[Transition]) -> Transition:
    """The one row of ``run``, calls whose ids extend each other in turn (a single call stands as it is).

    The row is the first call's (rollout, task, step, call id, weight, prompt); its ``reward`` is the
    last call's, and each segment carries its own call's. With ``with_text``, ``prompt_messages`` is
    the first call's and ``response_text`` is None (the text between segments is not recorded).
    """
    if len(run) == 1:
        return run[0]
    first, last = run[0], run[-1]
    base = len(first.prompt_ids)
    response = last.prompt_ids[base:] + last.response_ids
    segments = []
    for t in run:
        start = len(t.prompt_ids) - base
        segments.append(
            Segment(start=start, end=start + len(t.response_ids), step=t.step, call_id=t.call_id, reward=t.reward)
        )
    update = {"response_ids": response, "segments": segments, "reward": last.reward, "response_text": None}
    for name in PER_TOKEN_ARRAYS:
        update[name] = aligned([getattr(t, name) for t in run], segments, len(response))
    return first.model_copy(update=update)


def aligned(values: Sequence[array | None], segments: Sequence[Segment], length: int) -> array | None:
    """Each call's per-token ``values`` at its segment's positions of a ``length``-token response, 0 elsewhere.

    None where some call has none.
    """
    if any(v is None for v in values):
        return None
    out = array("f", bytes(4 * length))
    for v, seg in zip(values, segments, strict=True):
        out[seg.start : seg.end] = v
    return out
