"""Prefix caching: the keys and values of prompt tokens already computed, reused by later prompts.

Agents send the same long beginning over and over: a system message, tool schemas, worked
examples, then the conversation so far; a GRPO group sends the same prompt ``n`` times. The
batcher caches each prompt it computes, and each finished answer with its prompt, since an
agent's next call begins with both. A
:class:`PrefixCache` keeps the KV of whole prompt *blocks* (:data:`BLOCK_TOKENS` tokens)
keyed by the block's token ids and the block before it, as vLLM's automatic prefix caching
does, so a block is found only behind the very same prefix. A prompt's lookup walks its
blocks from the start and stops at the first one missing; the batcher then computes only
the tokens after the hit, attending to the cached keys and values.

A cache belongs to one set of weights: blocks computed with other weights are dropped when
the batcher first uses new ones (:meth:`PrefixCache.use`). In mixed mode (several adapters on
one base model, :mod:`agl_verl.engines.adapters`) each adapter has its own *space*: a chain
begins at its space's root, so one adapter's blocks are never found for another's prompt. It is bounded in bytes and
evicts least-recently-used blocks; a lookup or insert refreshes a chain from its last block
back to its first, so a prefix's later blocks go before its earlier ones, which more prompts share.

Reusing keys and values changes the shape of the matrix products, not the math: logits
agree with a full prefill to float tolerance (``tests/verl/test_prefix_cache.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

BLOCK_TOKENS = 16
"""Tokens a cached block holds: a prompt's hit is a whole number of blocks (vLLM's default size)."""

_Key = tuple[Hashable, tuple[int, ...]]

ROOT = -1
"""The space of a cache that serves one set of weights (block ids, the parents of later blocks, are positive)."""


@dataclass(eq=False)
class _Block:
    id: int
    #: per layer, keys and values of shape (heads, BLOCK_TOKENS, head_dim)
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    nbytes: int


class PrefixCache:
    """KV blocks of computed prompts, keyed by token-id prefix, at most ``max_bytes`` of them."""

    def __init__(self, max_bytes: int, *, block_tokens: int = BLOCK_TOKENS) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes: must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[_Key, _Block] = OrderedDict()
        self._next_id = 0
        self._weights: Any = None
        #: bytes of the blocks held now
        self.nbytes = 0
        #: blocks dropped to stay within ``max_bytes``
        self.evicted_blocks = 0

    @property
    def blocks(self) -> int:
        """How many blocks the cache holds."""
        return len(self._blocks)

    def use(self, weights: Any) -> None:
        """Serve ``weights`` (the model object) from now on; blocks of other weights are dropped."""
        if weights is not self._weights:
            self._blocks.clear()
            self.nbytes = 0
            self._weights = weights

    def reusable_blocks(self, prompt_ids: list[int]) -> int:
        """Whole blocks of ``prompt_ids`` that could be cached: all but the last token, which
        must be computed for its logits."""
        return (len(prompt_ids) - 1) // self.block_tokens

    def lookup(self, prompt_ids: list[int], space: Hashable = ROOT) -> list[_Block]:
        """The cached blocks ``prompt_ids`` begins with in ``space``, in order (marked recently used)."""
        return self._walk(prompt_ids, make=None, space=space)

    def gather(self, chain: list[_Block], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``chain`` at ``layer``: (heads, len(chain) × BLOCK_TOKENS, head_dim) each."""
        keys = torch.cat([block.layers[layer][0] for block in chain], dim=-2)
        values = torch.cat([block.layers[layer][1] for block in chain], dim=-2)
        return keys, values

    def insert(
        self,
        prompt_ids: list[int],
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        start: int = 0,
        space: Hashable = ROOT,
    ) -> None:
        """Cache the blocks of ``prompt_ids`` (a prompt, or a prompt and its answer) in ``space`` not cached yet.

        ``layers``: per layer, the keys and values of all of ``prompt_ids``, (heads,
        len(prompt_ids), head_dim) each; those of blocks ``0 .. start-1``, which the caller
        found cached, may be anything: if one was evicted since, nothing is inserted.
        """

        def make(i: int) -> _Block | None:
            if i < start:
                return None  # evicted since the caller's lookup: the chain is broken here
            cut = slice(i * self.block_tokens, (i + 1) * self.block_tokens)
            kv = [(k[..., cut, :].clone(), v[..., cut, :].clone()) for k, v in layers]
            self._next_id += 1
            return _Block(self._next_id, kv, sum(k.nbytes + v.nbytes for k, v in kv))

        self._walk(prompt_ids, make, space)
        self._evict()

    def _walk(
        self, prompt_ids: list[int], make: Callable[[int], _Block | None] | None, space: Hashable = ROOT
    ) -> list[_Block]:
        """The chain of blocks ``prompt_ids`` begins with in ``space``. At the first one missing,
        ``make(i)`` makes block ``i`` (it is added and the walk goes on), or the walk ends there."""
        chain: list[_Block] = []
        keys: list[_Key] = []
        parent: Hashable = space
        for i in range(self.reusable_blocks(prompt_ids)):
            key = self._key(parent, prompt_ids, i)
            block = self._blocks.get(key)
            if block is None and make is not None and (block := make(i)) is not None:
                self._blocks[key] = block
                self.nbytes += block.nbytes
            if block is None:
                break
            chain.append(block)
            keys.append(key)
            parent = block.id
        self._refresh(keys)
        return chain

    def _key(self, parent: Hashable, prompt_ids: list[int], i: int) -> _Key:
        return parent, tuple(prompt_ids[i * self.block_tokens : (i + 1) * self.block_tokens])

    def _refresh(self, chain: list[_Key]) -> None:
        """Mark a chain's blocks used, its first last: eviction takes a prefix's later blocks first."""
        for key in reversed(chain):
            self._blocks.move_to_end(key)

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.nbytes -= block.nbytes
            self.evicted_blocks += 1


def shared_blocks(a: list[int], b: list[int], block_tokens: int = BLOCK_TOKENS) -> int:
    """Whole blocks ``a`` and ``b`` begin with alike, of those ``a`` could reuse."""
    limit = min(len(a) - 1, len(b))
    common = 0
    while common < limit and a[common] == b[common]:
        common += 1
    return common // block_tokens
