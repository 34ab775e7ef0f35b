"""agl transitions → verl ``DataProto`` batches, laid out exactly as verl's trainers expect.

One row per transition (one LLM call):

- ``prompts`` (B, P): prompt ids, left-padded; ``responses`` (B, R): response ids, right-padded;
- ``input_ids`` = prompts ‖ responses; ``attention_mask`` 1 on real tokens;
  ``position_ids`` from the mask (verl's ``compute_position_id_with_mask``);
- ``response_mask`` (B, R): 1 on generated response tokens (every response token but a merged
  transition's context, below);
- ``token_level_scores`` = ``token_level_rewards`` (B, R): the transition's reward on its
  last response token, zero elsewhere;
- ``old_log_probs`` (B, R): the engine's raw logprobs, when every transition carries them;
- ``rollout_log_probs`` (B, R): the behaviour log-probs (what each token was sampled with),
  when every transition carries them, else the raw ones (the same at temperature 1 without
  top-p); ``meta_info["rollout_log_probs"]`` says which (``behaviour`` or ``raw``);
- ``weights`` (B,): the rollout-level normalization weight;
- non-tensor ``uid`` = ``task_id`` (the group key verl's estimators take as ``index``),
  plus ``rollout_id``, ``agent`` and ``model_version``.

A merged transition (several calls in one sequence, :attr:`agl.schema.Transition.segments`)
is one row too: its ``response_mask`` is 1 on the tokens its calls generated only (0 on the
tool results and turns between them), each call's reward sits on its segment's last token,
and the batch gets ``segment_of`` (B, R): the index of the call each response token belongs
to, numbered over the batch, -1 on context and padding. :func:`agl_verl.segments.per_call_advantages` computes
advantages call by call from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from agl.errors import AglError
from agl.schema import Transition


class TextTransitionError(AglError, ValueError):
    """A text-only transition reached a policy-gradient update."""


@dataclass(frozen=True)
class Selection:
    """The transitions a policy-gradient update may use, and what was set aside."""

    usable: list[Transition]
    text_only: int
    empty_response: int


def select_trainable(transitions: Sequence[Transition], *, on_text: str = "skip") -> Selection:
    """Drop what cannot feed a policy-gradient update, counting it.

    Text-only transitions (``token_source="text"``) carry no trustworthy ids or
    logprobs: with ``on_text="error"`` they raise :class:`TextTransitionError`,
    with ``"skip"`` they are left out and counted. Transitions with an empty
    response have no token to put the reward on and are counted too.
    """
    usable: list[Transition] = []
    text_only = empty = 0
    for t in transitions:
        if t.token_source != "engine":
            if on_text == "error":
                raise TextTransitionError(
                    f"transition {t.rollout_id}#{t.step} has token_source={t.token_source!r}: text-only "
                    "transitions carry no engine token ids or logprobs and cannot feed a policy-gradient update"
                )
            text_only += 1
        elif len(t.response_ids) == 0:
            empty += 1
        else:
            usable.append(t)
    return Selection(usable, text_only, empty)


def transitions_to_dataproto(
    transitions: Sequence[Transition],
    *,
    pad_token_id: int = 0,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> DataProto:
    """Build one verl batch from engine transitions (see the module docstring for the layout).

    Prompts longer than ``max_prompt_length`` keep their last tokens, responses
    longer than ``max_response_length`` are cut (the reward then lands on the last
    kept token); ``meta_info["truncated"]`` counts the rows affected.
    """
    _check_trainable(transitions)
    rows = _cut_rows(transitions, max_prompt_length, max_response_length)
    tensors = _padded_tensors(transitions, rows, pad_token_id)
    non_tensors = {
        "uid": np.array([t.task_id for t in transitions], dtype=object),
        "rollout_id": np.array([t.rollout_id for t in transitions], dtype=object),
        "agent": np.array([t.agent for t in transitions], dtype=object),
        "model_version": np.array([t.model_version for t in transitions], dtype=object),
    }
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors=non_tensors,
        meta_info={
            "truncated": rows.truncated,
            "merged": rows.merged,
            "pad_token_id": pad_token_id,
            "rollout_log_probs": "behaviour" if rows.behaviour is not None else "raw" if rows.logprobs else None,
        },
    )


def _check_trainable(transitions: Sequence[Transition]) -> None:
    """Refuse an empty batch, a text-only transition and an empty response, naming the transition."""
    if not transitions:
        raise ValueError("transitions: empty; a batch needs at least one transition")
    for t in transitions:
        if t.token_source != "engine":
            raise TextTransitionError(
                f"transition {t.rollout_id}#{t.step} has token_source={t.token_source!r}; "
                "filter with select_trainable() first"
            )
        if len(t.response_ids) == 0:
            raise ValueError(f"transition {t.rollout_id}#{t.step}: response_ids is empty")


@dataclass
class _Rows:
    """Each transition's prompt, response and (when every one has them) log-probs, cut to the length limits."""

    prompts: list[np.ndarray]
    responses: list[np.ndarray]
    logprobs: list[np.ndarray] | None
    truncated: int
    segments: list[list[tuple[int, int, float]]]
    """Each row's generated parts ``(start, end, reward)`` within its cut response."""
    merged: int = 0
    """Rows of more than one call."""
    behaviour: list[np.ndarray] | None = None


def _cut_rows(transitions: Sequence[Transition], max_prompt: int | None, max_response: int | None) -> _Rows:
    rows = _Rows([], [], [], 0, [], behaviour=[])
    for t in transitions:
        p = np.frombuffer(t.prompt_ids, dtype=np.int32)
        r = np.frombuffer(t.response_ids, dtype=np.int32)
        cut = False
        if max_prompt is not None and len(p) > max_prompt:
            p, cut = p[len(p) - max_prompt :], True
        if max_response is not None and len(r) > max_response:
            r, cut = r[:max_response], True
        rows.truncated += cut
        rows.segments.append(_segments_within(t, len(r)))
        rows.merged += t.segments is not None
        rows.prompts.append(p)
        rows.responses.append(r)
        if rows.logprobs is not None:
            if t.response_logprobs is None:
                rows.logprobs = None
            elif len(t.response_logprobs) != len(t.response_ids):
                raise ValueError(
                    f"transition {t.rollout_id}#{t.step}: {len(t.response_logprobs)} response_logprobs "
                    f"for {len(t.response_ids)} response_ids"
                )
            else:
                rows.logprobs.append(np.frombuffer(t.response_logprobs, dtype=np.float32)[: len(r)])
        if rows.behaviour is not None:
            if t.behaviour_logprobs is None:
                rows.behaviour = None
            else:
                rows.behaviour.append(np.frombuffer(t.behaviour_logprobs, dtype=np.float32)[: len(r)])
    return rows


def _segments_within(t: Transition, length: int) -> list[tuple[int, int, float]]:
    """The generated parts ``(start, end, reward)`` of ``t``'s response cut to ``length`` tokens
    (a part wholly past the cut is left out; the first one starts at 0, so one always stays)."""
    if t.segments is None:
        return [(0, length, t.reward)]
    return [(seg.start, min(seg.end, length), seg.reward) for seg in t.segments if seg.start < length]


def generated_mask(t: Transition) -> list[int]:
    """1 on each response token the model generated, 0 on the context between a merged transition's calls."""
    if t.segments is None:
        return [1] * len(t.response_ids)
    mask = [0] * len(t.response_ids)
    for seg in t.segments:
        mask[seg.start : seg.end] = [1] * (seg.end - seg.start)
    return mask


def _padded_tensors(transitions: Sequence[Transition], rows: _Rows, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Prompts left-padded, responses right-padded, the reward on each response's last token."""
    batch = len(transitions)
    p_len = max(len(p) for p in rows.prompts)
    r_len = max(len(r) for r in rows.responses)
    prompt_arr = np.full((batch, p_len), pad_token_id, dtype=np.int64)
    prompt_mask = np.zeros((batch, p_len), dtype=np.int64)
    response_arr = np.full((batch, r_len), pad_token_id, dtype=np.int64)
    response_real = np.zeros((batch, r_len), dtype=np.int64)
    response_mask = np.zeros((batch, r_len), dtype=np.int64)
    rewards = np.zeros((batch, r_len), dtype=np.float32)
    for i, (p, r) in enumerate(zip(rows.prompts, rows.responses, strict=True)):
        if len(p):
            prompt_arr[i, p_len - len(p) :] = p
            prompt_mask[i, p_len - len(p) :] = 1
        response_arr[i, : len(r)] = r
        response_real[i, : len(r)] = 1
        for start, end, reward in rows.segments[i]:
            response_mask[i, start:end] = 1
            rewards[i, end - 1] = reward

    prompts_t = torch.from_numpy(prompt_arr)
    responses_t = torch.from_numpy(response_arr)
    response_mask_t = torch.from_numpy(response_mask)
    attention_mask = torch.cat([torch.from_numpy(prompt_mask), torch.from_numpy(response_real)], dim=1)
    rewards_t = torch.from_numpy(rewards)
    tensors: dict[str, torch.Tensor] = {
        "prompts": prompts_t,
        "responses": responses_t,
        "input_ids": torch.cat([prompts_t, responses_t], dim=1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
        "response_mask": response_mask_t,
        "token_level_scores": rewards_t,
        "token_level_rewards": rewards_t.clone(),
        "weights": torch.tensor([t.weight for t in transitions], dtype=torch.float32),
    }
    if rows.merged:
        tensors["segment_of"] = _segment_index(rows.segments, r_len)
    if rows.logprobs is not None:
        tensors["old_log_probs"] = _padded_floats(rows.logprobs, r_len)
        tensors["rollout_log_probs"] = tensors["old_log_probs"].clone()
    if rows.behaviour is not None:
        tensors["rollout_log_probs"] = _padded_floats(rows.behaviour, r_len)
    return tensors


def _padded_floats(rows: list[np.ndarray], width: int) -> torch.Tensor:
    out = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


def _segment_index(segments: list[list[tuple[int, int, float]]], r_len: int) -> torch.Tensor:
    """(B, R): the batch-wide index of the call each response token belongs to, -1 on context and padding."""
    index = np.full((len(segments), r_len), -1, dtype=np.int64)
    n = 0
    for i, parts in enumerate(segments):
        for start, end, _reward in parts:
            index[i, start:end] = n
            n += 1
    return torch.from_numpy(index)
