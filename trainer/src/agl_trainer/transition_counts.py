"""How many transitions a run handed to the backend, per agent: a plugin to register for a run.

.. code-block:: python

    counts = TransitionCounts()
    agl.register_plugin(counts, name="transition-counts")
    Trainer(config).fit(agent, train_tasks)
    print(counts.by_agent)        # {"rewrite_query": 310, "write_query": 512}

It counts what the trainer built after the agent filter (``transitions.agents``), which is
what an arm that trains only some agents wants to show.

Given a ``path`` (a file in the run's work directory), the counts are kept there step by step,
so a run resumed in a new process counts the steps its earlier processes trained too, and a
step run again after an interruption is counted once.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import agl


class TransitionCounts:
    """Counts the transitions of every step by agent (``(none)`` for calls no agent made)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.by_step: dict[int, Counter[str]] = {}
        if path is not None and path.exists():
            self.by_step = {int(step): Counter(counts) for step, counts in json.loads(path.read_text()).items()}

    @property
    def by_agent(self) -> Counter[str]:
        """The transitions of all steps, by agent."""
        return sum(self.by_step.values(), Counter())

    @agl.hookimpl
    def agl_transitions_built(self, step, transitions):
        """This step's transitions by agent (replacing the step's counts from an interrupted try)."""
        self.by_step[step] = Counter(t.agent or "(none)" for t in transitions)
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(k): dict(v) for k, v in sorted(self.by_step.items())}))
            os.replace(tmp, self.path)
