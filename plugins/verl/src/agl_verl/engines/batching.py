"""Continuous batching: many concurrent requests, one forward pass per decoding step.

A :class:`Batcher` owns one worker thread. Requests queue up as :class:`Sequence` rows
(a request with ``n`` choices is ``n`` rows). Scheduling is per iteration, as in vLLM and
TGI: before every decoding step the worker admits queued rows (up to ``max_batch_size``
running), prefills them together, left-pads their KV cache to the running batch's width
and concatenates it on the batch dimension; after the step, rows that finished or were
cancelled leave the batch (``index_select`` on the cache), and all-padding columns on the
left are trimmed. With a prefix cache (:mod:`agl_verl.engines.prefix_cache`), an admission
computes each distinct prompt once and only past the blocks already cached. Each row has its
own sampling parameters, stop conditions and random generator. New weights, published through
a :class:`WeightSlot`, are picked up only when no row is running: once a swap is pending the
worker stops admitting, drains the running rows on the old weights, then switches, so a
request never sees two models.

Logprobs are the log-softmax of the model's raw logits (fp32) at the chosen token, before
temperature or top-p: what a training forward pass over the same ids computes, whatever
the sampling settings were. Tokens forced by constrained decoding get the same treatment.
Beside them each row keeps its *behaviour* log-probs: the log-prob of each token under the
distribution it was actually drawn from (after temperature and top-p, renormalised), which
importance weights between the sampling and the training policy need; a greedy or forced
token had probability 1, so its behaviour log-prob is 0.

Why not transformers' own ``init_continuous_batching`` / ``ContinuousBatchingManager``
(checked on transformers 5.10): its logprobs are taken after the logits processors
(temperature, top-p), it has no top-logprobs, one global random generator (no per-request
seed) and no forced tokens, so it cannot give the ids and logprobs training needs.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from transformers import DynamicCache

from agl_verl.engines.adapters import AdapterSet
from agl_verl.engines.prefix_cache import ROOT, PrefixCache, shared_blocks
from agl_verl.engines.protocol import Decoding


@dataclass(kw_only=True)
class SamplingParams(Decoding):
    """How one row is decoded: its request's :class:`~agl_verl.engines.protocol.Decoding`, how
    many tokens at most, and how many top logprobs to report per token."""

    max_tokens: int
    top_logprobs: int = 0


@dataclass
class Sequence:
    """One row: a prompt, how to decode it, and what came out."""

    prompt_ids: list[int]
    params: SamplingParams
    forced_ids: list[int] = field(default_factory=list)
    on_token: Callable[[Sequence], None] | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: each token's log-prob under the distribution it was drawn from (after temperature and
    #: top-p; 0.0 for a greedy or forced token, which had probability 1)
    behaviour_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    #: where a stop string begins in the decoded text (the text is cut there)
    stop_at: int | None = None
    #: the stop string that ended the row (the first one in the text), as vLLM's ``stop_reason`` names it
    stop_str: str | None = None
    model_version: str | None = None
    #: the ``model`` the request named: picks the policy in mixed mode (:mod:`agl_verl.engines.adapters`)
    model_name: str | None = None
    #: the adapter the row is decoded with in mixed mode (held from admission until it finishes)
    adapter: str | None = None
    cancelled: bool = False
    _job: _Job | None = None
    _adapters: AdapterSet | None = None


class _Choice(NamedTuple):
    """One row's next token: its raw log-prob, its log-prob as sampled, and the top raw log-probs."""

    token: int
    logprob: float
    behaviour_logprob: float
    top: list[tuple[int, float]]


@dataclass
class _Job:
    rows: list[Sequence]
    future: concurrent.futures.Future
    remaining: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class WeightSlot:
    """The model served now and its version; swapped atomically."""

    def __init__(self, model: Any, version: str | None) -> None:
        self._lock = threading.Lock()
        self._model = model
        self._version = version

    def get(self) -> tuple[Any, str | None]:
        with self._lock:
            return self._model, self._version

    def set(self, model: Any, version: str | None) -> None:
        with self._lock:
            self._model, self._version = model, version


@dataclass
class _Row:
    seq: Sequence
    generator: torch.Generator


@dataclass
class _Batch:
    """The running batch: its rows, their shared KV cache, attention mask and positions."""

    model: Any
    version: str | None
    rows: list[_Row] = field(default_factory=list)
    cache: Any = None
    mask: torch.Tensor | None = None
    #: position of each row's last cached token
    next_pos: torch.Tensor | None = None

    def select(self, keep: list[int], device: torch.device) -> None:
        """Keep only the rows at ``keep``; trim cache columns that are padding in every row."""
        self.rows = [self.rows[b] for b in keep]
        self.take(keep, device)

    def take(self, index: list[int], device: torch.device) -> None:
        """Cache, mask and positions of the rows at ``index`` (repeats allowed); trims padding columns."""
        if not index:
            self.cache, self.mask, self.next_pos = None, None, None
            return
        picked = torch.tensor(index, dtype=torch.long, device=device)
        self.cache.batch_select_indices(picked)
        self.mask, self.next_pos = self.mask[picked], self.next_pos[picked]
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start > 0:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., start:, :], layer.values[..., start:, :]

    def merge(self, other: _Batch) -> None:
        """Append ``other``'s rows, left-padding the narrower cache and mask to the wider width."""
        if self.mask is None:
            self.rows, self.cache, self.mask, self.next_pos = other.rows, other.cache, other.mask, other.next_pos
            return
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width, -2), _left_pad(theirs.keys, width, -2)], dim=0)
            mine.values = torch.cat([_left_pad(mine.values, width, -2), _left_pad(theirs.values, width, -2)], dim=0)
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.rows = self.rows + other.rows


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zeros on the left of ``dim`` up to ``width``."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class Batcher:
    """Runs queued sequences through the model with continuous batching on a worker thread."""

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
        prefix_cache_bytes: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size: must be at least 1")
        if prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes: must be 0 (off) or more, got {prefix_cache_bytes}")
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
        self._pending: list[Sequence] = []
        self._running_count = 0
        #: the KV blocks of prompts computed before; None: every prompt is computed whole
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
        #: counters: prefills run, most rows seen running together, prompt tokens of every row,
        #: prompt tokens computed (the rest came from the cache or a row with the same prompt),
        #: tokens generated
        self.batches = 0
        self.max_rows_seen = 0
        self.prompt_tokens = 0
        self.prompt_tokens_computed = 0
        self.generated_tokens = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

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
        for row in self._pending:
            self._fail(row, RuntimeError("engine stopped"))

    @property
    def prompt_tokens_cached(self) -> int:
        """Prompt tokens not computed: found in the prefix cache or shared with a row of the same prompt."""
        return self.prompt_tokens - self.prompt_tokens_computed

    @property
    def running_rows(self) -> int:
        """How many rows are in the running batch now."""
        return self._running_count

    @property
    def queued_rows(self) -> int:
        """How many submitted rows wait to join the running batch."""
        return self._queue.qsize() + len(self._pending)

    # -- worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        batch: _Batch | None = None
        while not self._closed.is_set():
            if batch is None or not batch.rows:
                batch = self._fresh_batch()
                if batch is None:
                    continue
            try:
                with torch.inference_mode():
                    self._admit(batch)
                    self._drop_cancelled(batch)
                    if batch.rows:
                        self._step(batch)
            except Exception as exc:  # noqa: BLE001 - reported to every request in the batch
                for row in batch.rows:
                    self._fail(row.seq, exc)
                batch.rows = []
            self._running_count = len(batch.rows)
        if batch is not None:
            for row in batch.rows:
                self._fail(row.seq, RuntimeError("engine stopped"))

    def _fresh_batch(self) -> _Batch | None:
        """Wait for a first row, then start an empty batch on the weights served now."""
        if not self._pending:
            try:
                self._pending.append(self._queue.get(timeout=0.1))
            except queue.Empty:
                return None
        model, version = self.slot.get()
        return _Batch(model=model, version=version)

    def _take_queued(self, room: int, wait: bool) -> list[Sequence]:
        """Up to ``room`` queued rows; waits ``batch_wait_s`` for stragglers if ``wait``."""
        taken = self._pending[:room]
        del self._pending[:room]
        deadline = time.monotonic() + (self.batch_wait_s if wait else 0.0)
        while len(taken) < room:
            timeout = deadline - time.monotonic()
            try:
                taken.append(self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def _admit(self, batch: _Batch) -> None:
        """Prefill queued rows and merge them into the running batch (not while a swap waits)."""
        room = self.max_batch_size - len(batch.rows)
        if room <= 0:
            return
        if batch.rows:
            model, version = self.slot.get()
            if model is not batch.model or (version != batch.version and not isinstance(model, AdapterSet)):
                return  # drain on the old weights first (in mixed mode each row keeps its adapter instead)
        newcomers = []
        for seq in self._take_queued(room, wait=not batch.rows):
            if seq.cancelled:
                seq.finish_reason = "abort"
                self._row_done(seq)
            else:
                newcomers.append(seq)
        if not newcomers:
            return
        try:
            self._prefill(batch, newcomers)
        except Exception as exc:  # noqa: BLE001 - the running rows are untouched and go on
            for seq in newcomers:
                self._fail(seq, exc)

    def _prefill(self, batch: _Batch, seqs: list[Sequence]) -> None:
        """Compute the prompts of ``seqs``, choose each row's first token and merge the rows into ``batch``.

        With a prefix cache, rows with the same prompt are computed once, each prompt only past
        its cached blocks, and prompts that share blocks nobody has computed yet go in waves: the
        first wave computes the shared blocks, the next finds them cached.
        """
        self.batches += 1
        for seq in seqs:
            if isinstance(batch.model, AdapterSet):
                seq.adapter, seq.model_version = batch.model.acquire(seq.model_name)
                seq._adapters = batch.model
            else:
                seq.model_version = batch.version
        self.prompt_tokens += sum(len(seq.prompt_ids) for seq in seqs)
        if self.prefix_cache is None:
            piece, logits = self._compute(batch.model, [seq.prompt_ids for seq in seqs], [seq.adapter for seq in seqs])
        else:
            self.prefix_cache.use(batch.model)
            prompts, adapters, prompt_of_row = _unique_prompts(seqs)
            piece, logits, where = self._compute_in_waves(batch.model, prompts, adapters)
            index = [where[p] for p in prompt_of_row]
            piece.take(index, self.device)
            logits = logits[index]
        rows = [_Row(seq, self._generator_for(seq)) for seq in seqs]
        piece.rows = rows
        keep = self._choose_and_advance(logits, rows)
        if len(keep) < len(rows):
            piece.select(keep, self.device)
        batch.merge(piece)
        self.max_rows_seen = max(self.max_rows_seen, len(batch.rows))

    def _compute_in_waves(
        self, model: Any, prompts: list[list[int]], adapters: list[str | None]
    ) -> tuple[_Batch, torch.Tensor, list[int]]:
        """:meth:`_compute` of ``prompts`` (each through its adapter) in waves that share no uncached block.

        Returns the rows' cache in the order computed, their last logits in the same order,
        and where each prompt's row is in it.
        """
        cache = self.prefix_cache
        piece, logits, where = _Batch(model, None), [], [0] * len(prompts)
        remaining, done = list(range(len(prompts))), 0
        while remaining:
            wave, later = [], []
            for i in remaining:
                cached = len(cache.lookup(prompts[i], _space(adapters[i])))
                shares = any(
                    adapters[i] == adapters[j] and shared_blocks(prompts[i], prompts[j], cache.block_tokens) > cached
                    for j in wave
                )
                (later if shares else wave).append(i)
            part, part_logits = self._compute(model, [prompts[i] for i in wave], [adapters[i] for i in wave])
            piece.merge(part)
            logits.append(part_logits)
            for k, i in enumerate(wave):
                where[i] = done + k
            done += len(wave)
            remaining = later
        return piece, torch.cat(logits), where

    def _compute(self, model: Any, prompts: list[list[int]], adapters: list[str | None]) -> tuple[_Batch, torch.Tensor]:
        """One forward pass over ``prompts`` past their cached blocks, each through its adapter (mixed
        mode); their cache (right-aligned, no rows yet) and each prompt's last logits. New whole blocks
        go into the prefix cache, under the adapter that computed them."""
        cache = self.prefix_cache
        spaces = [_space(adapter) for adapter in adapters]
        hits = (
            [cache.lookup(p, s) for p, s in zip(prompts, spaces, strict=True)]
            if cache is not None
            else [[] for _ in prompts]
        )
        block = cache.block_tokens if cache is not None else 0
        prefix_width = max(len(hit) for hit in hits) * block
        suffixes = [p[len(hit) * block :] for p, hit in zip(prompts, hits, strict=True)]
        width = max(len(suffix) for suffix in suffixes)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), prefix_width + width), dtype=torch.long)
        for i, (hit, suffix) in enumerate(zip(hits, suffixes, strict=True)):
            input_ids[i, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[i, prefix_width - len(hit) * block : prefix_width] = 1
            mask[i, prefix_width + width - len(suffix) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, prefix_width:]
        input_ids, mask, positions = input_ids.to(self.device), mask.to(self.device), positions.to(self.device)
        kv = self._cache_of(hits, prefix_width)
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=kv,
            use_cache=True,
            logits_to_keep=1,
            **_adapter_names(model, adapters),
        )
        self.prompt_tokens_computed += sum(len(suffix) for suffix in suffixes)
        if cache is not None:
            mask = _right_align(kv, mask)
            for i, prompt in enumerate(prompts):
                if cache.reusable_blocks(prompt) > len(hits[i]):
                    tail = slice(mask.shape[1] - len(prompt), None)
                    layers = [(layer.keys[i, :, tail, :], layer.values[i, :, tail, :]) for layer in kv.layers]
                    cache.insert(prompt, layers, start=len(hits[i]), space=spaces[i])
        return _Batch(model, None, [], kv, mask, positions[:, -1]), out.logits[:, -1, :].float()

    def _cache_of(self, hits: list[list], width: int) -> DynamicCache:
        """A KV cache holding each row's cached blocks, left-padded to ``width`` columns."""
        kv = DynamicCache()
        if width == 0:
            return kv
        reference = next(hit for hit in hits if hit)[0].layers
        for layer, (ref_keys, ref_values) in enumerate(reference):
            keys, values = [], []
            for hit in hits:
                k, v = self.prefix_cache.gather(hit, layer) if hit else (ref_keys[..., :0, :], ref_values[..., :0, :])
                keys.append(_left_pad(k, width, -2))
                values.append(_left_pad(v, width, -2))
            kv.update(torch.stack(keys), torch.stack(values), layer)
        return kv

    def _generator_for(self, seq: Sequence) -> torch.Generator:
        if seq.params.seed is None:
            return self._generator
        return torch.Generator().manual_seed(seq.params.seed)

    def _drop_cancelled(self, batch: _Batch) -> None:
        keep = []
        for b, row in enumerate(batch.rows):
            if row.seq.cancelled:
                row.seq.finish_reason = "abort"
                self._row_done(row.seq)
            else:
                keep.append(b)
        if len(keep) < len(batch.rows):
            batch.select(keep, self.device)

    def _step(self, batch: _Batch) -> None:
        """Feed every row's last token through the model once; choose and append the next."""
        tokens = torch.tensor([row.seq.token_ids[-1] for row in batch.rows], dtype=torch.long, device=self.device)
        batch.mask = torch.cat(
            [batch.mask, torch.ones((len(batch.rows), 1), dtype=torch.long, device=self.device)], dim=1
        )
        batch.next_pos = batch.next_pos + 1
        out = batch.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=batch.mask,
            position_ids=batch.next_pos.unsqueeze(1),
            past_key_values=batch.cache,
            use_cache=True,
            **_adapter_names(batch.model, [row.seq.adapter for row in batch.rows]),
        )
        keep = self._choose_and_advance(out.logits[:, -1, :].float(), batch.rows)
        if len(keep) < len(batch.rows):
            self._cache_finished(batch, keep)
            batch.select(keep, self.device)

    def _cache_finished(self, batch: _Batch, keep: list[int]) -> None:
        """Cache the blocks of the rows leaving ``batch``, generated tokens too: an agent's next
        call usually begins with this call's prompt and answer."""
        cache = self.prefix_cache
        if cache is None:
            return
        width, kept = batch.mask.shape[1], set(keep)
        for b, row in enumerate(batch.rows):
            ids = row.seq.prompt_ids + row.seq.token_ids[:-1]  # the last token chosen was never fed
            if b in kept or cache.reusable_blocks(ids) <= cache.reusable_blocks(row.seq.prompt_ids):
                continue
            tail = slice(width - len(ids), None)
            layers = [(layer.keys[b, :, tail, :], layer.values[b, :, tail, :]) for layer in batch.cache.layers]
            cache.insert(ids, layers, space=_space(row.seq.adapter))

    def _choose_and_advance(self, logits: torch.Tensor, rows: list[_Row]) -> list[int]:
        """Pick each row's next token; return the batch indices of rows that go on."""
        chosen = self._choose(logits, [row.seq for row in rows], [row.generator for row in rows])
        keep = []
        for b, row in enumerate(rows):
            if self._advance(row.seq, chosen[b]):
                keep.append(b)
            else:
                self._row_done(row.seq)
        return keep

    def _row_done(self, row: Sequence) -> None:
        _let_go(row)
        job = row._job
        if job is None:
            return
        with job.lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last and not job.future.done():
            job.future.set_result(job.rows)

    def _fail(self, row: Sequence, exc: BaseException) -> None:
        _let_go(row)
        job = row._job
        if job is not None and not job.future.done():
            job.future.set_exception(exc)

    def _choose(self, logits: torch.Tensor, rows: list[Sequence], generators: list[torch.Generator]) -> list[_Choice]:
        """Each row's next token. What is read back from the device (greedy picks, the sampled rows'
        probabilities, the chosen log-probs) is read for the whole batch at once, four reads a step
        at most rather than up to three a row: on a GPU each read waits for the device. With reads row by
        row the engine made 0.35-0.37x of the bare model's decode rate at 32-64 rows on an H200
        (docs/results/benchmarks.md, "On a GPU"); the batched reads have not been timed there yet.
        The values are the same as row by row, bit for bit (tests/verl/test_batched_choice.py)."""
        logp = torch.log_softmax(logits, dim=-1)
        picks: list[int] = [0] * len(rows)
        behaviour: list[float] = [0.0] * len(rows)  # greedy and forced tokens had probability 1
        sample: list[int] = []
        greedy: list[int] = []
        for b, row in enumerate(rows):
            step = len(row.token_ids)
            if step < len(row.forced_ids):
                picks[b] = row.forced_ids[step]
            elif row.params.temperature == 0:
                greedy.append(b)
            else:
                sample.append(b)
        if greedy:
            for b, token in zip(greedy, logits[greedy].argmax(dim=-1).tolist(), strict=True):
                picks[b] = token
        if sample:
            index = torch.tensor(sample, dtype=torch.long, device=logits.device)
            temps = torch.tensor([rows[b].params.temperature for b in sample], device=logits.device)
            probs = torch.softmax(logits[index] / temps.unsqueeze(1), dim=-1)
            top_ps = [rows[b].params.top_p for b in sample]
            if any(p < 1.0 for p in top_ps):
                probs = _top_p_filter(probs, torch.tensor(top_ps, device=logits.device))
            on_cpu = probs.cpu()  # the seeded draws run on the CPU, each row with its own generator
            drawn = [int(torch.multinomial(on_cpu[k], 1, generator=generators[b])) for k, b in enumerate(sample)]
            rows_index = torch.arange(len(sample), device=logits.device)
            drawn_index = torch.tensor(drawn, dtype=torch.long, device=logits.device)
            for b, token, value in zip(sample, drawn, torch.log(probs[rows_index, drawn_index]).tolist(), strict=True):
                picks[b] = token
                behaviour[b] = value
        chosen = logp[torch.arange(len(rows), device=logits.device), torch.tensor(picks, device=logits.device)]
        result = []
        for b, (row, value) in enumerate(zip(rows, chosen.tolist(), strict=True)):
            top: list[tuple[int, float]] = []
            if row.params.top_logprobs:
                values, ids = torch.topk(logp[b], row.params.top_logprobs)
                top = list(zip(ids.tolist(), values.tolist(), strict=False))
            result.append(_Choice(picks[b], value, behaviour[b], top))
        return result

    def _advance(self, row: Sequence, choice: _Choice) -> bool:
        """Append the chosen token; return whether the row goes on."""
        token = choice.token
        self.generated_tokens += 1
        row.token_ids.append(token)
        row.logprobs.append(choice.logprob)
        row.behaviour_logprobs.append(choice.behaviour_logprob)
        row.top_logprobs.append(choice.top)
        params = row.params
        forcing = len(row.token_ids) <= len(row.forced_ids)
        if not forcing:
            if token in self.eos_token_ids and not params.ignore_eos or token in params.stop_token_ids:
                row.finish_reason = "stop"
            elif params.stop:
                text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
                hits = [(text.find(s), k) for k, s in enumerate(params.stop) if s in text]
                if hits:
                    row.stop_at, first = min(hits)
                    row.stop_str = params.stop[first]
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


def _unique_prompts(seqs: list[Sequence]) -> tuple[list[list[int]], list[str | None], list[int]]:
    """The distinct (adapter, prompt) pairs of ``seqs`` as prompts and their adapters, and which each row has."""
    index: dict[tuple, int] = {}
    prompts: list[list[int]] = []
    adapters: list[str | None] = []
    of_row = []
    for seq in seqs:
        key = (seq.adapter, tuple(seq.prompt_ids))
        if key not in index:
            index[key] = len(prompts)
            prompts.append(seq.prompt_ids)
            adapters.append(seq.adapter)
        of_row.append(index[key])
    return prompts, adapters, of_row


def _space(adapter: str | None) -> Any:
    """The prefix-cache space of rows on ``adapter`` (None: the one set of weights served)."""
    return ROOT if adapter is None else adapter


def _adapter_names(model: Any, adapters: list[str | None]) -> dict[str, Any]:
    """The forward pass's ``adapter_names`` argument in mixed mode; nothing otherwise."""
    return {"adapter_names": adapters} if isinstance(model, AdapterSet) else {}


def _let_go(row: Sequence) -> None:
    """Give back the adapter a finished (or failed) row held in mixed mode."""
    adapters, row._adapters = row._adapters, None
    if adapters is not None:
        adapters.release(row.adapter)


def _right_align(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Move each row's padding columns to the left of its tokens (in place on ``cache``); the new mask.

    A prompt computed past a cached prefix has padding between the two parts when the batch's
    rows differ in length; the running batch keeps every row's tokens contiguous on the right.
    """
    order = torch.argsort(mask, dim=1, stable=True)
    if torch.equal(order, torch.arange(mask.shape[1], device=mask.device).expand_as(order)):
        return mask
    for layer in cache.layers:
        index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
        layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
    return mask.gather(1, order)


def _top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    drop = (cumulative - sorted_probs) > top_p.unsqueeze(1)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)
