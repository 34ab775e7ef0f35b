"""The agent's instructions, kept short for a 135M model.

The engine appends the tool definitions and the ``<tool_call>`` convention to them
(``agl_verl.engines.tools``), about 150 tokens; each search adds two passages.

Tried on validation questions, never on test (see docs/results/rag-agent.md): a worked two-hop
example given as prior Responses input items made the base model copy the example's
own names into its searches ("Soran", "Ivo Tam") for every question; without it, the
forced first search names the question's company or person most of the time.
"""

from __future__ import annotations

INSTRUCTIONS = "Answer the question with the search tool. Search for each name you need. Reply with only the answer."
