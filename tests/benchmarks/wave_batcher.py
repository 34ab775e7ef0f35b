"""The engine's batcher before continuous batching, kept as the benchmark's baseline.

Scheduling by waves: the worker takes what is queued (at most ``max_batch_size`` rows),
prefills it and decodes until every row of that wave finished; rows queued meanwhile wait
for the next wave. It is :class:`agl_verl.engines.batching.Batcher` with only the
scheduling replaced (sampling, stop conditions and bookkeeping are the engine's own), so
``tests.benchmarks.bench_engine`` plugs it into the same engine and ``Replica``.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import torch
from transformers import DynamicCache

from agl_verl.engines.batching import Batcher, Sequence


class WaveBatcher(Batcher):
    """Runs queued sequences through the model in dynamic batches (waves) on a worker thread."""

    # -- worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            rows = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(rows) < self.max_batch_size:
                timeout = deadline - time.monotonic()
                try:
                    rows.append(self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            live = [row for row in rows if not row.cancelled]
            for row in rows:
                if row.cancelled:
                    row.finish_reason = "abort"
                    self._row_done(row)
            if not live:
                continue
            model, version = self.slot.get()
            try:
                with torch.inference_mode():
                    self._generate(model, version, live)
            except Exception as exc:  # noqa: BLE001 - reported to every waiting request
                for row in live:
                    self._fail(row, exc)
                continue
            for row in live:
                self._row_done(row)

    def _generate(self, model: Any, version: str | None, rows: list[Sequence]) -> None:
        self.batches += 1
        self.max_rows_seen = max(self.max_rows_seen, len(rows))
        width = max(len(row.prompt_ids) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            row.model_version = version
            input_ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids, dtype=torch.long)
            mask[i, width - len(row.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        input_ids, mask, positions = input_ids.to(self.device), mask.to(self.device), positions.to(self.device)
        cache = DynamicCache()
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :].float()
        next_pos = positions[:, -1]
        active = list(range(len(rows)))  # batch row -> index into rows
        generators = [
            torch.Generator().manual_seed(row.params.seed) if row.params.seed is not None else self._generator
            for row in rows
        ]
        while True:
            chosen = self._choose(logits, [rows[i] for i in active], [generators[i] for i in active])
            still: list[int] = []
            for b, i in enumerate(active):
                row = rows[i]
                if self._advance(row, chosen[b]):
                    still.append(b)
            if not still:
                return
            if len(still) < len(active):
                keep = torch.tensor(still, dtype=torch.long, device=self.device)
                cache.batch_select_indices(keep)
                mask, next_pos = mask[keep], next_pos[keep]
                active = [active[b] for b in still]
                tokens = torch.tensor([rows[i].token_ids[-1] for i in active], dtype=torch.long)
            else:
                tokens = torch.tensor([rows[i].token_ids[-1] for i in active], dtype=torch.long)
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=torch.long, device=self.device)], dim=1)
            next_pos = next_pos + 1
            out = model(
                input_ids=tokens.unsqueeze(1).to(self.device),
                attention_mask=mask,
                position_ids=next_pos.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :].float()
