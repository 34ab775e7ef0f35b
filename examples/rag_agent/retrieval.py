"""Retrieval over the collection: a BM25 index (bm25s), built in memory on first use.

The index is built from the generated passages (530 of them, about 0.1 s); nothing is
downloaded. Queries and passages are lower-cased and English stopwords dropped; words
the collection never uses are ignored, so a query with none of its words finds nothing.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import bm25s

from .collection import build_world, passages

TOP_K = 2
"""Passages a search returns: enough for the right one to be there, few enough to keep prompts short."""

_lock = threading.Lock()  # bm25s retrieval is not documented as thread-safe; rollouts run in threads


class Index:
    """A BM25 index over ``docs`` (dicts with ``doc_id`` and ``text``)."""

    def __init__(self, docs: list[dict]):
        self.docs = docs
        self.bm25 = bm25s.BM25()
        tokens = bm25s.tokenize([d["text"] for d in docs], stopwords="en", show_progress=False)
        self.bm25.index(tokens, show_progress=False)
        self.vocab = set(tokens.vocab)

    def search(self, query: str, k: int = TOP_K) -> list[dict]:
        """The best ``k`` passages for ``query`` (fewer when fewer match at all), best first."""
        words = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        words = [w for w in words if w in self.vocab]
        if not words:
            return []
        with _lock:
            ids, scores = self.bm25.retrieve([words], k=min(k, len(self.docs)), show_progress=False, n_threads=1)
        return [self.docs[int(i)] for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


@lru_cache(maxsize=1)
def default_index() -> Index:
    """The index over the example's collection (built once per process)."""
    return Index(passages(build_world()))


def format_hits(hits: list[dict]) -> str:
    """What the search tool tells the model: one passage per line, or that nothing matched."""
    if not hits:
        return "No results."
    return "\n".join(d["text"] for d in hits)
