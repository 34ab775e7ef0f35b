"""Candidates (resources to try), the exchanges rollouts hold, the beam, and the per-step record.

A candidate's ``version`` is its resources version: ``s<step>c<k>-<digest>``, the digest of its
resources, so two different texts never share a version (nor the rollout ids scoring them).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agl.schema import Transition

DEMO = "Question: {question}\nAnswer: {answer}"
"""How a demonstration is written into a list resource: the agent splits it back at ``\\nAnswer: ``."""


@dataclass
class Candidate:
    """Resources to try: where they came from, and the validation score they got on their last step."""

    version: str
    parent: str | None
    method: str  # "initial", "textual_gradient" or "bootstrap_demos"
    resources: dict[str, Any]
    step: int = 0
    order: int = 0  # when it was made: the older of two equal scores stays ahead
    critique: str | None = None
    score: float | None = None
    scores: list[float] = field(default_factory=list)

    def record(self, parent: Candidate | None, resource: str, step: int) -> dict[str, Any]:
        """The line of ``apo/candidates.jsonl`` for this candidate at ``step``."""
        return {
            "step": step,
            "id": self.version,
            "parent": self.parent,
            "method": self.method,
            "score": self.score,
            "scores": self.scores,
            "prompt": self.resources.get(resource),
            "resources": self.resources,
            "diff": resources_diff(parent.resources if parent else {}, self.resources) if parent else "",
            "critique": self.critique,
        }


def resources_version(step: int, k: int, resources: dict[str, Any]) -> str:
    digest = hashlib.blake2b(json.dumps(resources, sort_keys=True).encode(), digest_size=4).hexdigest()
    return f"s{step}c{k}-{digest}"


def _lines(value: Any) -> list[str]:
    text = value if isinstance(value, str) else "\n\n".join(map(str, value or []))
    return text.splitlines(keepends=True)


def resources_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A unified diff (difflib) of each resource that changed, ``a/<name>`` against ``b/<name>``."""
    out: list[str] = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            out += difflib.unified_diff(_lines(old.get(name)), _lines(new.get(name)), f"a/{name}", f"b/{name}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def best_first(candidates: list[Candidate], width: int) -> list[Candidate]:
    """The ``width`` best-scoring candidates, best first; a tie goes to the one made first."""
    return sorted(candidates, key=lambda c: (-(c.score if c.score is not None else float("-inf")), c.order))[:width]


@dataclass
class Exchange:
    """One rollout as the search reads it: the task the model was given, its last answer, the reward."""

    rollout_id: str
    question: str
    answer: str
    reward: float


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def exchanges(transitions: list[Transition]) -> list[Exchange]:
    """Each rollout's exchange: the last user message of its first call, its last call's response text and
    reward. The answer is "" where that call wrote no text (a tool call: transitions keep a response's text,
    not its tool calls); a rollout whose first call carries no user text is left out."""
    by_rollout: dict[str, list[Transition]] = {}
    for t in transitions:
        by_rollout.setdefault(t.rollout_id, []).append(t)
    out = []
    for rollout_id, calls in by_rollout.items():
        calls.sort(key=lambda t: t.step)
        users = [_text(m.get("content")) for m in calls[0].prompt_messages or [] if m.get("role") == "user"]
        if users and users[-1].strip():
            out.append(
                Exchange(rollout_id, users[-1].strip(), (calls[-1].response_text or "").strip(), calls[-1].reward)
            )
    return out


class CandidateLog:
    """``apo/candidates.jsonl`` under the run's workdir: one line per candidate per step. A step run
    again (a resumed run) replaces its lines instead of adding them twice."""

    def __init__(self, path: Path | None):
        self.path = path

    def write(self, step: int, records: list[dict[str, Any]]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] < step]
        lines = kept + [json.dumps(r) for r in records]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(self.path)


def as_dict(candidate: Candidate) -> dict[str, Any]:
    return asdict(candidate)


__all__ = [
    "DEMO",
    "Candidate",
    "CandidateLog",
    "Exchange",
    "as_dict",
    "best_first",
    "exchanges",
    "resources_diff",
    "resources_version",
]
