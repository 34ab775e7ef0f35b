"""Recorded training steps of the examples, as :mod:`tests.benchmarks.bench_step` replays them.

One fixture is one step of one example's training run, ``data/steps/<agent>-step<k>.json.gz``:

* ``rollouts``: per rollout, its LLM calls in order, each ``prompt_ids``, ``response_ids``,
  ``temperature`` and ``max_tokens`` (what the agent asked for, or the rollout's cap);
* ``transitions``: the step's :class:`agl.schema.Transition` objects as the backend got them;
* ``measured``: the step's ``time_step_s``, ``time_rollout_s``, ``time_update_s`` and the
  backend's ``update_s`` from the run's ``metrics.jsonl``; ``settings``: the run's seed,
  learning rate, sampling temperature and rollout concurrency.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data" / "steps"
FORMAT = 1
MEASURED_KEYS = ("time_step_s", "time_rollout_s", "time_transitions_s", "time_update_s", "time_publish_s", "update_s")


@dataclass(frozen=True)
class Call:
    """One recorded LLM call: the prompt's and the response's token ids and how it was sampled."""

    prompt_ids: list[int]
    response_ids: list[int]
    temperature: float
    max_tokens: int


@dataclass(frozen=True)
class StepFixture:
    """One recorded training step of one example."""

    agent: str
    step: int
    rollouts: list[list[Call]]
    transitions: list[dict[str, Any]]
    measured: dict[str, float]
    settings: dict[str, Any]

    @property
    def calls(self) -> list[Call]:
        """Every call of the step, rollout by rollout."""
        return [call for rollout in self.rollouts for call in rollout]

    def prompt_tokens(self) -> int:
        """Prompt tokens over every call (what an engine without a cache prefills)."""
        return sum(len(call.prompt_ids) for call in self.calls)

    def response_tokens(self) -> int:
        """Response tokens over every call (what a replay generates)."""
        return sum(len(call.response_ids) for call in self.calls)

    def build_transitions(self) -> list:
        """The step's transitions as :class:`agl.schema.Transition` objects."""
        from agl.schema import Transition

        return [Transition.model_validate(t) for t in self.transitions]


def fixture_path(agent: str, step: int, directory: Path = DATA_DIR) -> Path:
    """Where the fixture of ``agent``'s step ``step`` lives."""
    return directory / f"{agent}-step{step}.json.gz"


def write_fixture(fixture: StepFixture, directory: Path = DATA_DIR) -> Path:
    """Write ``fixture`` gzipped (compact JSON); returns its path."""
    body = {
        "format": FORMAT,
        "agent": fixture.agent,
        "step": fixture.step,
        "settings": fixture.settings,
        "measured": fixture.measured,
        "rollouts": [[call.__dict__ for call in rollout] for rollout in fixture.rollouts],
        "transitions": fixture.transitions,
    }
    path = fixture_path(fixture.agent, fixture.step, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(body, separators=(",", ":")).encode(), mtime=0))
    return path


def load_fixture(path: Path) -> StepFixture:
    """Read a fixture; a ``ValueError`` naming the field for one that is not in this format."""
    body = json.loads(gzip.decompress(Path(path).read_bytes()))
    if body.get("format") != FORMAT:
        raise ValueError(f"{path}: format: expected {FORMAT}, got {body.get('format')!r}")
    for key in ("agent", "step", "rollouts", "transitions", "measured", "settings"):
        if key not in body:
            raise ValueError(f"{path}: {key}: missing")
    rollouts = [[Call(**call) for call in rollout] for rollout in body["rollouts"]]
    return StepFixture(body["agent"], body["step"], rollouts, body["transitions"], body["measured"], body["settings"])


def fixtures_of(agent: str | None, directory: Path = DATA_DIR) -> list[Path]:
    """The committed fixtures of ``agent`` (all agents: None), in order of agent and step."""
    paths = directory.glob(f"{agent or '*'}-step*.json.gz")
    return sorted(paths, key=lambda p: (p.name.rsplit("-step", 1)[0], int(p.name.rsplit("-step", 1)[1].split(".")[0])))


def completion_body(call: Call, model: str) -> dict[str, Any]:
    """The ``/v1/completions`` request that redoes ``call``'s work: its prompt as token ids, exactly
    as many tokens as it generated (``ignore_eos``), at its temperature."""
    return {
        "model": model,
        "prompt": call.prompt_ids,
        "max_tokens": max(1, len(call.response_ids)),
        "temperature": call.temperature,
        "ignore_eos": True,
        "return_token_ids": True,
    }
