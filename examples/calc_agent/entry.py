"""What ``agl train`` loads: the agent function; train.yaml names the reward plugin.

    agl train examples/calc_agent/entry.py:calc_agent --config examples/calc_agent/train.yaml \
        --model "$(agl engine model-path smollm2)" \
        --tasks examples/calc_agent/data/train.jsonl --val examples/calc_agent/data/test.jsonl

The agent lives in the ``calc_agent`` package under ``examples/``, which this file puts
on the path, so that ``plugins: [calc_agent.rewards]`` in train.yaml imports too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calc_agent.agent import calc_agent  # noqa: E402

__all__ = ["calc_agent"]
