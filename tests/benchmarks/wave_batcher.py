"""The engine's batcher before continuous batching (issue 17), kept as the benchmark's baseline.

Scheduling by waves: the worker takes what is queued (at most ``max_batch_size`` rows),
prefills it and decodes until every row of that wave finished; rows queued meanwhile wait
for the next wave. Same interface as :class:`agl_verl.engines.batching.Batcher`, so
``tests.benchmarks.bench_engine`` plugs it into the same engine and ``Replica``.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Any

import torch

from agl_verl.engines.batching import Sequence, WeightSlot, _Job, _top_p_filter


class WaveBatcher:
    """Runs queued sequences through the model in dynamic batches (waves) on a worker thread."""

    def __init__(
        self,
        slot: WeightSlot,
        tokenizer: Any,
        *,
        eos_token_ids: list[int],
        pad_token_id: int,
        max_model_len: int,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.002,
        seed: int = 0,
        device: str = "cpu",
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size: must be at least 1")
        self.slot = slot
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.device = torch.device(device)
        self._generator = torch.Generator().manual_seed(seed)
        self._queue: queue.Queue[Sequence] = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        #: counters for tests and benchmarks
        self.batches = 0
        self.max_rows_seen = 0

    def submit(self, rows: list[Sequence]) -> concurrent.futures.Future:
        """Queue ``rows``; the future resolves to the same list once every row finished."""
        if self._closed.is_set():
            raise RuntimeError("batcher is closed")
        future: concurrent.futures.Future = concurrent.futures.Future()
        job = _Job(rows=rows, future=future, remaining=len(rows))
        for row in rows:
            row._job = job
            self._queue.put(row)
        return future

    def close(self) -> None:
        """Stop the worker; queued rows fail."""
        self._closed.set()
        self._thread.join(timeout=30)
        while True:
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                break
            self._fail(row, RuntimeError("engine stopped"))

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

    def _row_done(self, row: Sequence) -> None:
        job = row._job
        if job is None:
            return
        with job.lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last and not job.future.done():
            job.future.set_result(job.rows)

    def _fail(self, row: Sequence, exc: BaseException) -> None:
        job = row._job
        if job is not None and not job.future.done():
            job.future.set_exception(exc)

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
        from transformers import DynamicCache

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

    def _choose(
        self, logits: torch.Tensor, rows: list[Sequence], generators: list[torch.Generator]
    ) -> list[tuple[int, float, list[tuple[int, float]]]]:
        logp = torch.log_softmax(logits, dim=-1)
        picks: list[int] = [0] * len(rows)
        sample: list[int] = []
        for b, row in enumerate(rows):
            step = len(row.token_ids)
            if step < len(row.forced_ids):
                picks[b] = row.forced_ids[step]
            elif row.params.temperature == 0:
                picks[b] = int(torch.argmax(logits[b]))
            else:
                sample.append(b)
        if sample:
            index = torch.tensor(sample, dtype=torch.long, device=logits.device)
            temps = torch.tensor([rows[b].params.temperature for b in sample], device=logits.device)
            probs = torch.softmax(logits[index] / temps.unsqueeze(1), dim=-1)
            top_ps = [rows[b].params.top_p for b in sample]
            if any(p < 1.0 for p in top_ps):
                probs = _top_p_filter(probs, torch.tensor(top_ps, device=logits.device))
            for k, b in enumerate(sample):
                picks[b] = int(torch.multinomial(probs[k].cpu(), 1, generator=generators[b]))
        result = []
        for b, row in enumerate(rows):
            token = picks[b]
            top: list[tuple[int, float]] = []
            if row.params.top_logprobs:
                values, ids = torch.topk(logp[b], row.params.top_logprobs)
                top = list(zip(ids.tolist(), values.tolist(), strict=False))
            result.append((token, float(logp[b, token]), top))
        return result

    def _advance(self, row: Sequence, choice: tuple[int, float, list[tuple[int, float]]]) -> bool:
        """Append the chosen token; return whether the row goes on."""
        token, logprob, top = choice
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        row.top_logprobs.append(top)
        params = row.params
        forcing = len(row.token_ids) <= len(row.forced_ids)
        if not forcing:
            if token in self.eos_token_ids and not params.ignore_eos or token in params.stop_token_ids:
                row.finish_reason = "stop"
            elif params.stop:
                text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
                hits = [text.find(s) for s in params.stop if s in text]
                if hits:
                    row.stop_at = min(hits)
                    row.finish_reason = "stop"
        if row.finish_reason is None:
            if (
                len(row.token_ids) >= params.max_tokens
                or len(row.prompt_ids) + len(row.token_ids) >= self.max_model_len
            ):
                row.finish_reason = "length"
            elif row.cancelled:
                row.finish_reason = "abort"
        if row.on_token is not None:
            row.on_token(row)
        return row.finish_reason is None
