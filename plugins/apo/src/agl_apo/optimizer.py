"""The optimizer model: critiques of low-reward rollouts and rewritten prompts, robust to a weak model.

Any OpenAI-compatible endpoint, through the ``openai`` client. A small model often answers
with something that is not a prompt at all: :func:`extract_prompts` takes fenced blocks, else
the answer itself when it is plausibly a prompt, else nothing, and :class:`OptimizerModel`
counts every failure (a call that failed, an answer with no fenced block, a candidate thrown
away) instead of raising, so a search step never stops on a bad answer.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass

from agl_apo.settings import OptimizerSettings

log = logging.getLogger(__name__)

NO_TEXT = "(no text: the assistant called a tool, or wrote nothing)"
"""What a critique is shown for an answer with no text (a tool call: transitions keep no tool calls)."""
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)

CRITIQUE_SYSTEM = (
    "You improve the instructions given to an AI assistant. You read the instructions, some tasks the assistant "
    "got wrong and what it answered, and you explain briefly what in the instructions led to the mistakes."
)
CRITIQUE_USER = (
    "The instructions:\n```\n{prompt}\n```\n\nTasks the assistant did badly on (reward from 0 to 1):\n\n{failures}\n\n"
    "In a few sentences: why did the instructions lead to these answers, and what should they say instead?"
)
REWRITE_SYSTEM = "You rewrite the instructions given to an AI assistant so that it does its task better."
REWRITE_USER = (
    "The instructions:\n```\n{prompt}\n```\n\nWhat went wrong with them:\n{critique}\n\n"
    "Write {n} improved version(s) of the instructions. Put each version in its own ``` fenced block, "
    "and nothing but the instructions inside a block."
)


@dataclass
class Failure:
    """A low-reward rollout as the critique shows it: what the model was asked, what it answered, its reward."""

    question: str
    answer: str
    reward: float

    def render(self, limit: int) -> str:
        answer = _cut(self.answer, limit) if self.answer else NO_TEXT
        return f"Task: {_cut(self.question, limit)}\nAnswer: {answer}\nReward: {self.reward:g}"


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split()) if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def extract_prompts(answer: str, parent: str, limit: int) -> tuple[list[str], bool]:
    """The prompts in an optimizer's answer, and whether they came from fenced blocks.

    Fenced blocks first; with none, the whole answer when it reads as a prompt (not empty, not
    the parent again, at most ``limit`` characters, no leftover fence). Blanks and repeats go.
    """
    blocks = [b.strip() for b in _FENCE.findall(answer or "")]
    fenced = bool(blocks)
    if not fenced:
        whole = (answer or "").strip()
        blocks = [whole] if whole and "```" not in whole and len(whole) <= limit else []
    out: list[str] = []
    for b in blocks:
        if b and b != parent.strip() and b not in out and len(b) <= limit:
            out.append(b)
    return out, fenced


class OptimizerModel:
    """Calls the optimizer model; ``counts`` holds ``calls``, ``errors``, ``unfenced`` and ``discarded``."""

    def __init__(self, settings: OptimizerSettings, base_url: str, model: str | None):
        from openai import OpenAI

        self.settings = settings
        self.client = OpenAI(base_url=base_url, api_key=settings.key(), timeout=settings.timeout_s, max_retries=2)
        self.model = model or self._first_model()
        self.counts: Counter[str] = Counter()

    def _first_model(self) -> str:
        listed = [m.id for m in self.client.models.list()]
        if not listed:
            raise RuntimeError(f"optimizer: {self.client.base_url} lists no model; set backend.config.optimizer.model")
        return listed[0]

    def ask(self, system: str, user: str, seed: int) -> str:
        """The model's answer, or "" when the call failed (counted, logged once a call)."""
        self.counts["calls"] += 1
        try:
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                temperature=self.settings.temperature,
                max_tokens=self.settings.max_tokens,
                seed=seed,
            )
            return reply.choices[0].message.content or ""
        except Exception as exc:  # any failure of a model we do not control is counted, never raised
            self.counts["errors"] += 1
            log.warning("apo optimizer call failed: %s: %s", type(exc).__name__, exc)
            return ""

    def critique(self, prompt: str, failures: list[Failure], limit: int, seed: int) -> str:
        shown = "\n\n".join(f.render(limit) for f in failures)
        return self.ask(CRITIQUE_SYSTEM, CRITIQUE_USER.format(prompt=prompt, failures=shown), seed).strip()

    def rewrite(self, prompt: str, critique: str, n: int, seed: int) -> list[str]:
        """Up to ``n`` rewritten prompts (fewer when the model wrote fewer usable ones; counted)."""
        answer = self.ask(REWRITE_SYSTEM, REWRITE_USER.format(prompt=prompt, critique=critique, n=n), seed)
        limit = max(4 * len(prompt), 2000)
        prompts, fenced = extract_prompts(answer, prompt, limit)
        if not fenced:
            self.counts["unfenced"] += 1
        self.counts["discarded"] += max(0, n - len(prompts))
        return prompts[:n]


__all__ = ["Failure", "OptimizerModel", "extract_prompts"]
