"""How many transitions a run handed to the backend, per agent: a plugin to register for a run.

.. code-block:: python

    counts = TransitionCounts()
    agl.register_plugin(counts, name="transition-counts")
    Trainer(config).fit(agent, train_tasks)
    print(counts.by_agent)        # {"rewrite_query": 310, "write_query": 512}

It counts what the trainer built after the agent filter (``transitions.agents``), which is
what an arm that trains only some agents wants to show.
"""

from __future__ import annotations

from collections import Counter

import agl


class TransitionCounts:
    """Counts the transitions of every step by agent (``(none)`` for calls no agent made)."""

    def __init__(self) -> None:
        self.by_agent: Counter[str] = Counter()

    @agl.hookimpl
    def agl_transitions_built(self, step, transitions):
        """Add this step's transitions to the per-agent counts."""
        self.by_agent.update(t.agent or "(none)" for t in transitions)
