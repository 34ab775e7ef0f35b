"""Advantages of merged rows, computed call by call.

A merged row (several calls of one rollout in one sequence, see :mod:`agl_verl.dataproto`)
holds one segment of generated tokens per call, each with its call's reward on its last
token. verl's estimators take one scalar score per row (GRPO normalises the scores of a
group), so they are run on a *per-call view* of the batch: one row per segment, its tokens
and its reward alone, laid out exactly as the unmerged batch would be. The advantages they
give are then spread back over the merged rows' token positions. A batch with no merged
row goes to the estimator as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from verl import DataProto


def per_call_advantages(data: DataProto, compute: Callable[[DataProto], DataProto]) -> DataProto:
    """``data`` with ``advantages`` and ``returns`` from ``compute`` (verl's ``compute_advantage``
    with its settings), run call by call where ``data`` has merged rows (``segment_of``)."""
    if "segment_of" not in data.batch:
        return compute(data)
    view, (rows, cols, ids, offsets) = per_call_view(data)
    view = compute(view)
    for key in ("advantages", "returns"):
        spread = torch.zeros_like(data.batch["token_level_rewards"])
        spread[rows, cols] = view.batch[key][ids, offsets].to(spread.dtype)
        data.batch[key] = spread
    return data


def per_call_view(data: DataProto) -> tuple[DataProto, tuple[torch.Tensor, ...]]:
    """One row per call of ``data`` (its segment's tokens right-aligned at 0, its reward and group),
    and where each of its tokens sits: (row, column) in ``data``, (call, offset) in the view."""
    segment_of = data.batch["segment_of"]
    rows, cols = (segment_of >= 0).nonzero(as_tuple=True)
    ids = segment_of[rows, cols]
    n = int(ids.max()) + 1
    start = torch.full((n,), segment_of.shape[1], dtype=cols.dtype).scatter_reduce(0, ids, cols, "amin")
    offsets = cols - start[ids]
    width = int(offsets.max()) + 1
    mask = torch.zeros((n, width), dtype=data.batch["response_mask"].dtype)
    mask[ids, offsets] = 1
    rewards = torch.zeros((n, width), dtype=data.batch["token_level_rewards"].dtype)
    rewards[ids, offsets] = data.batch["token_level_rewards"][rows, cols]
    row_of = torch.zeros(n, dtype=torch.long)
    row_of[ids] = rows
    view = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_scores": rewards, "token_level_rewards": rewards.clone()},
        non_tensors={"uid": data.non_tensor_batch["uid"][row_of.numpy()]},
    )
    return view, (rows, cols, ids, offsets)
