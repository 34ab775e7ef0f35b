"""What ``agl train`` loads: the agent function, with the reward plugin registered on import.

    agl train examples/sql_agent/entry.py:sql_agent --config examples/sql_agent/train.yaml \
        --model "$(agl engine model-path smollm2)" \
        --tasks examples/sql_agent/data/train.jsonl --val examples/sql_agent/data/test.jsonl

``agl train`` takes no plugin list, so the module that names the agent registers the
reward, as a user's own module would (an installed package would use an ``agl``
entry point instead).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agl  # noqa: E402
from agl.plugins import get_plugin_manager  # noqa: E402
from sql_agent import rewards  # noqa: E402
from sql_agent.agent import sql_agent  # noqa: E402

if get_plugin_manager().get_plugin("sql-execution-match") is None:
    agl.register_plugin(rewards, name="sql-execution-match")

__all__ = ["sql_agent"]
