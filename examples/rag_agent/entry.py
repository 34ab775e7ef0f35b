"""What ``agl train`` loads: the agent function; train.yaml names the reward plugin.

    agl train examples/rag_agent/entry.py:rag_agent --config examples/rag_agent/train.yaml \
        --model "$(agl engine model-path smollm2)" \
        --tasks examples/rag_agent/data/train.jsonl --val examples/rag_agent/data/test.jsonl

The agent lives in the ``rag_agent`` package under ``examples/``, which this file puts on
the path, so that ``plugins: [rag_agent.rewards]`` in train.yaml imports too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag_agent.agent import rag_agent  # noqa: E402

__all__ = ["rag_agent"]
