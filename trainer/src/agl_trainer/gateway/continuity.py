"""Does each call of a multi-turn rollout extend an earlier one, token for token?

In a multi-turn agent, call k+1's prompt usually contains call k's prompt and
response. When its prompt ids start with exactly those ids, the two calls can be
trained as one growing context. When an agent (or a chat template) rewrote the
history, re-tokenized the model's output, or dropped a turn, they do not, and
training on re-tokenized text would silently differ from what was sampled. This
module says which case each call is, and for a rewrite, exactly where and how the
ids differ.

For each call, the earlier call sharing the longest prefix with it is its
*predecessor*:

- ``extends``: the prompt starts with the predecessor's prompt + response ids;
- ``rewritten``: it shares at least the predecessor's whole prompt, or at least
  ``min_shared`` of it, but differs before the predecessor's response ends; the
  report gives the first differing position and the token windows around it;
- ``new``: no earlier call, or too little shared for a rewrite (a new context,
  for example another sub-agent with its own system prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agl.schema import LLMCall


@dataclass(frozen=True)
class Mismatch:
    """Where a call's prompt departs from what an earlier call saw and produced."""

    position: int
    """Index of the first differing token in the prompt."""
    expected: list[int]
    """The earlier call's prompt + response ids around ``position`` (from ``window_start``)."""
    actual: list[int]
    """This call's prompt ids around ``position`` (from ``window_start``)."""
    window_start: int
    in_response: bool
    """True when the difference lies in the earlier call's response (the model's output was altered)."""

    def describe(self, decode: Callable[[list[int]], str] | None = None) -> str:
        where = "the previous response" if self.in_response else "the previous prompt"
        exp = decode(self.expected) if decode else self.expected
        act = decode(self.actual) if decode else self.actual
        return (
            f"prompt differs from {where} at token {self.position}: "
            f"expected {exp!r}, got {act!r} (tokens {self.window_start}..)"
        )


@dataclass(frozen=True)
class Continuity:
    """How one call relates to the calls before it."""

    call_id: str
    seq: int
    status: Literal["new", "extends", "rewritten"]
    previous: str | None = None
    """The call id of the predecessor (None for ``new``)."""
    shared: int = 0
    """How many leading prompt ids it shares with the predecessor's prompt + response."""
    mismatch: Mismatch | None = None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on slice equality: C-speed compares
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_continuity(calls: Sequence[LLMCall], *, window: int = 8, min_shared: float = 0.5) -> list[Continuity]:
    """One :class:`Continuity` per call, in the order given (a rollout's calls in ``seq`` order)."""
    out: list[Continuity] = []
    history: list[tuple[LLMCall, list[int], int]] = []  # (call, prompt + response, prompt length)
    for call in calls:
        prompt = list(call.prompt_ids)
        best: tuple[int, LLMCall, list[int], int] | None = None
        for prev, full, plen in reversed(history):  # latest first: ties go to the most recent call
            shared = _common_prefix(full, prompt)
            if best is None or shared > best[0]:
                best = (shared, prev, full, plen)
        status, mismatch, previous, shared = "new", None, None, 0
        if best is not None:
            shared, prev, full, plen = best
            previous = prev.call_id
            if shared == len(full):
                status = "extends"
            elif shared >= plen or (plen and shared >= min_shared * plen):
                status = "rewritten"
                start = max(0, shared - window)
                mismatch = Mismatch(
                    shared, full[start : shared + window], prompt[start : shared + window], start, shared >= plen
                )
            else:
                previous = None
        out.append(Continuity(call.call_id, call.seq, status, previous, shared, mismatch))
        history.append((call, prompt + list(call.response_ids), len(prompt)))
    return out


def report(results: Sequence[Continuity], decode: Callable[[list[int]], str] | None = None) -> str:
    """A readable summary, one line per call."""
    lines = []
    for r in results:
        line = f"#{r.seq} {r.call_id}: {r.status}"
        if r.previous:
            line += f" {r.previous} ({r.shared} tokens shared)"
        if r.mismatch:
            line += "; " + r.mismatch.describe(decode)
        lines.append(line)
    return "\n".join(lines)
