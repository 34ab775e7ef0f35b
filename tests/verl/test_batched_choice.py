"""The engine's token choice reads the device once a step, and picks what reading row by row picks.

``Batcher._choose`` reads greedy picks, the sampled rows' probabilities and the chosen
log-probs for the whole batch at once (on a GPU each read is a sync). The reference below is
the row-by-row reading the engine had before: every value must come out the same, bit for bit,
for a batch that mixes forced, greedy, sampled and top-p rows, with and without top log-probs.
"""

from __future__ import annotations

import torch

from agl_verl.engines.batching import Batcher, SamplingParams, Sequence, _top_p_filter


def reference_choices(logits: torch.Tensor, rows: list[Sequence], generators: list[torch.Generator]) -> list[tuple]:
    """One read per value, row by row."""
    logp = torch.log_softmax(logits, dim=-1)
    picks, behaviour, sample = [0] * len(rows), [0.0] * len(rows), []
    for b, row in enumerate(rows):
        step = len(row.token_ids)
        if step < len(row.forced_ids):
            picks[b] = row.forced_ids[step]
        elif row.params.temperature == 0:
            picks[b] = int(torch.argmax(logits[b]))
        else:
            sample.append(b)
    if sample:
        temps = torch.tensor([rows[b].params.temperature for b in sample])
        probs = torch.softmax(logits[torch.tensor(sample)] / temps.unsqueeze(1), dim=-1)
        top_ps = [rows[b].params.top_p for b in sample]
        if any(p < 1.0 for p in top_ps):
            probs = _top_p_filter(probs, torch.tensor(top_ps))
        for k, b in enumerate(sample):
            picks[b] = int(torch.multinomial(probs[k].cpu(), 1, generator=generators[b]))
            behaviour[b] = float(torch.log(probs[k, picks[b]]))
    out = []
    for b, row in enumerate(rows):
        top = []
        if row.params.top_logprobs:
            values, ids = torch.topk(logp[b], row.params.top_logprobs)
            top = list(zip(ids.tolist(), values.tolist(), strict=False))
        out.append((picks[b], float(logp[b, picks[b]]), behaviour[b], top))
    return out


def mixed_rows() -> list[Sequence]:
    def row(forced: list[int] | None = None, **params) -> Sequence:
        return Sequence(prompt_ids=[1, 2], params=SamplingParams(max_tokens=8, **params), forced_ids=forced or [])

    return [
        row(temperature=0.0),
        row(temperature=1.0),
        row(temperature=0.5, top_p=0.9, top_logprobs=3),
        row(forced=[7], temperature=1.0),
        row(temperature=0.0, top_logprobs=2),
        row(temperature=1.3),
    ]


def generators_for(rows: list[Sequence], seed: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + b) for b in range(len(rows))]


def test_batched_reads_choose_what_row_by_row_reads_choose():
    for seed in range(20):
        logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(seed)) * 3
        rows = mixed_rows()
        chosen = Batcher._choose(None, logits, rows, generators_for(rows, seed))
        expected = reference_choices(logits, rows, generators_for(rows, seed))
        assert [tuple(c) for c in chosen] == expected, f"seed {seed}"
        assert chosen[3].token == 7 and chosen[3].behaviour_logprob == 0.0
        assert chosen[0].behaviour_logprob == 0.0 and len(chosen[4].top) == 2 and len(chosen[2].top) == 3


def test_a_batch_of_only_forced_rows_reads_nothing_to_sample():
    rows = [Sequence(prompt_ids=[1], params=SamplingParams(max_tokens=4), forced_ids=[3, 4]) for _ in range(2)]
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    chosen = Batcher._choose(None, logits, rows, generators_for(rows, 0))
    assert [c.token for c in chosen] == [3, 3]
    assert [c.logprob for c in chosen] == torch.log_softmax(logits, dim=-1)[:, 3].tolist()
