"""The ``apo`` backend: searches prompts and few-shot examples instead of training weights.

Each step, from that step's transitions (text-only ones too: ``needs_token_ids`` is False):

1. the rollouts become exchanges (the task as the model saw it, its answer, the reward);
2. ``textual_gradient``: the optimizer model reads the current best prompt and a few of the
   lowest-reward exchanges, writes a critique, then ``candidates_per_step`` rewritten prompts;
3. ``bootstrap_demos``: the exchanges with the step's best reward (above 0) and a text answer join a pool of
   demonstrations, and ``candidates_per_step`` random subsets of it (up to ``max_demos``) become
   the ``demos_resource`` of new candidates;
4. the beam and the new candidates are scored on a validation batch (``val_batch_size`` tasks
   drawn from the ``score_tasks`` of the trainer's :class:`~agl_trainer.backend.BackendContext`,
   run by its ``score``), and the ``beam_width`` best are kept (a tie goes to the older
   candidate); the best is what the next rollouts run with (:meth:`resources`).

Every candidate of a step, with its parent, method, score, prompt, diff against its parent and
critique, is a line of ``apo/candidates.jsonl`` in the run's workdir; the step's counts are
its metrics. The checkpoint holds the beam, the demonstration pool and the random state, so
a run killed and resumed goes on with its beam. Publishing names the best resources in a
:class:`~agl.schema.ModelVersion` (no path: the engine keeps its weights).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

from agl.errors import ConfigError
from agl.schema import ModelVersion, Task, Transition
from agl_apo.candidates import (
    DEMO,
    Candidate,
    CandidateLog,
    Exchange,
    as_dict,
    best_first,
    exchanges,
    resources_version,
)
from agl_apo.optimizer import Failure, OptimizerModel
from agl_apo.settings import parse_settings
from agl_trainer.backend import STANDALONE, Backend, BackendContext
from agl_trainer.engine import Engine

log = logging.getLogger(__name__)

STATE_FILE = "apo_state.json"
MAX_POOL = 64
"""Demonstrations kept in the pool at most (the first ones found)."""


class ApoBackend(Backend):
    """Prompt optimization over the trainer's rollouts; ``config`` is :class:`agl_apo.settings.ApoSettings`."""

    needs_token_ids = False

    def __init__(self, **config: Any):
        self.settings = parse_settings(config)
        self.rng = random.Random(self.settings.seed)
        self.beam: list[Candidate] = []
        self.pool: list[str] = []
        self.made = 0
        self.optimizer: OptimizerModel | None = None
        self.log = CandidateLog(None)

    # -- the seam ------------------------------------------------------------------------
    def setup(self, engine: Engine | None, context: BackendContext = STANDALONE) -> None:
        s = self.settings
        if context.score is None:
            raise ConfigError("backend apo: needs the trainer's score (run it under agl.Trainer)")
        if not context.score_tasks:
            raise ConfigError("backend apo: no tasks to score candidates on (give val tasks)")
        self.context = context
        version, resources = context.initial_resources or ("r0", {})
        if "textual_gradient" in s.methods and not isinstance(resources.get(s.resource), str):
            raise ConfigError(
                f"resources.{s.resource}: apo rewrites it (backend.config.resource), but the run declares no such "
                "text resource; add it to the trainer config's resources"
            )
        demos = resources.get(s.demos_resource)
        if "bootstrap_demos" in s.methods and demos is not None and not isinstance(demos, list):
            raise ConfigError(f"resources.{s.demos_resource}: demonstrations go there, so it must be a list of texts")
        self.beam = [Candidate(version, None, "initial", dict(resources))]
        if context.workdir is not None:
            self.log = CandidateLog(Path(context.workdir) / "apo" / "candidates.jsonl")
        if s.optimizer is not None and "textual_gradient" in s.methods:
            base_url = s.optimizer.base_url
            if s.optimizer.engine:
                if engine is None:
                    raise ConfigError(
                        "backend.config.optimizer.engine: true needs the run's engine (the trainer config's engine); "
                        "for a running server give optimizer.base_url instead"
                    )
                base_url = engine.start()[0]  # started already by the trainer: its URLs again
            self.optimizer = OptimizerModel(s.optimizer, base_url, s.optimizer.model)

    def resources(self) -> tuple[str, dict[str, Any]] | None:
        best = self.beam[0]
        return best.version, dict(best.resources)

    def train_step(self, transitions: list[Transition], step: int) -> dict[str, float]:
        if self.optimizer is not None:
            self.optimizer.counts.clear()  # the step's own counts
        found = exchanges(transitions)
        parent = self.beam[0]
        fresh = self._propose(parent, found, step)
        batch = self._val_batch()
        known = {json.dumps(c.resources, sort_keys=True) for c in self.beam}
        fresh = [c for c in fresh if json.dumps(c.resources, sort_keys=True) not in known]
        score = self.context.score
        assert score is not None, "setup refuses a context without a scorer"
        for c in [*self.beam, *fresh]:
            c.scores = [float(v) for v in score(batch, c.version, c.resources)]
            c.score = sum(c.scores) / len(c.scores) if c.scores else 0.0
        everyone = {c.version: c for c in [*self.beam, *fresh]}
        self.beam = best_first([*self.beam, *fresh], self.settings.beam_width)
        self.log.write(
            step, [c.record(everyone.get(c.parent or ""), self.settings.resource, step) for c in everyone.values()]
        )
        return self._metrics(parent, fresh, found, len(batch))

    def publish(self, step: int) -> ModelVersion:
        best = self.beam[0]
        return ModelVersion(
            version=f"apo-{step}-{best.version}",
            step=step,
            metadata={
                "resources_version": best.version,
                "resources": best.resources,
                "base": self.context.current_version,
            },
        )

    def save_checkpoint(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {"beam": [as_dict(c) for c in self.beam], "pool": self.pool, "made": self.made}
        state["rng"] = self.rng.getstate()
        (directory / STATE_FILE).write_text(json.dumps(state))

    def load_checkpoint(self, directory: Path) -> None:
        state = json.loads((directory / STATE_FILE).read_text())
        self.beam = [Candidate(**c) for c in state["beam"]]
        self.pool, self.made = state["pool"], state["made"]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

    # -- the search ----------------------------------------------------------------------
    def _val_batch(self) -> list[Task]:
        tasks = list(self.context.score_tasks)
        return self.rng.sample(tasks, min(self.settings.val_batch_size, len(tasks)))

    def _new(self, parent: Candidate, method: str, resources: dict[str, Any], step: int, **extra: Any) -> Candidate:
        self.made += 1
        version = resources_version(step, self.made, resources)
        return Candidate(version, parent.version, method, resources, step=step, order=self.made, **extra)

    def _propose(self, parent: Candidate, found: list[Exchange], step: int) -> list[Candidate]:
        out: list[Candidate] = []
        if "textual_gradient" in self.settings.methods:
            out += self._rewrites(parent, found, step)
        if "bootstrap_demos" in self.settings.methods:
            out += self._demo_sets(parent, found, step)
        return out

    def _rewrites(self, parent: Candidate, found: list[Exchange], step: int) -> list[Candidate]:
        s, optimizer = self.settings, self.optimizer
        assert optimizer is not None
        top = max((x.reward for x in found), default=0.0)
        low = [x for x in found if x.reward < top] or (list(found) if top <= 0 else [])
        if not low:
            return []  # every rollout did as well as the best: nothing to critique
        low.sort(key=lambda x: x.reward)
        shown = self.rng.sample(low[: 2 * s.failures_shown], min(s.failures_shown, len(low)))
        prompt = parent.resources[s.resource]
        failures = [Failure(x.question, x.answer, x.reward) for x in shown]
        critique = optimizer.critique(prompt, failures, s.max_text_chars, seed=s.seed + step)
        if not critique:
            return []
        texts = optimizer.rewrite(prompt, critique, s.candidates_per_step, seed=s.seed + step)
        return [
            self._new(parent, "textual_gradient", {**parent.resources, s.resource: t}, step, critique=critique)
            for t in texts
        ]

    def _demo_sets(self, parent: Candidate, found: list[Exchange], step: int) -> list[Candidate]:
        s = self.settings
        top = max((x.reward for x in found), default=0.0)
        for x in found:
            demo = DEMO.format(question=x.question, answer=x.answer)
            if x.answer and top > 0 and x.reward >= top and demo not in self.pool and len(self.pool) < MAX_POOL:
                self.pool.append(demo)
        out = []
        for _ in range(s.candidates_per_step if self.pool else 0):
            chosen = self.rng.sample(self.pool, self.rng.randint(1, min(s.max_demos, len(self.pool))))
            out.append(self._new(parent, "bootstrap_demos", {**parent.resources, s.demos_resource: chosen}, step))
        return out

    def _metrics(
        self, parent: Candidate, fresh: list[Candidate], found: list[Exchange], batch: int
    ) -> dict[str, float]:
        best = self.beam[0]
        counts = self.optimizer.counts if self.optimizer is not None else {}
        return {
            "apo/candidates": float(len(fresh)),
            "apo/best_score": float(best.score or 0.0),
            "apo/parent_score": float(parent.score or 0.0),
            "apo/changed": float(best.version != parent.version),
            "apo/exchanges": float(len(found)),
            "apo/demo_pool": float(len(self.pool)),
            "apo/val_batch": float(batch),
            **{f"apo/optimizer_{k}": float(v) for k, v in counts.items()},
        }


__all__ = ["ApoBackend"]
