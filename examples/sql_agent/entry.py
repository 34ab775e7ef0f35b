"""What ``agl train`` loads: the agent function; train.yaml names the reward plugin.

    agl train examples/sql_agent/entry.py:sql_agent --config examples/sql_agent/train.yaml \
        --model "$(agl engine model-path smollm2)" \
        --tasks examples/sql_agent/data/train-easy.jsonl --val examples/sql_agent/data/test.jsonl

The agent lives in the ``sql_agent`` package under ``examples/``, which this file puts on
the path, so that ``plugins: [sql_agent.rewards]`` in train.yaml imports too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sql_agent.agent import sql_agent  # noqa: E402

__all__ = ["sql_agent"]
