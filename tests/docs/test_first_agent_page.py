"""docs/getting-started/first-agent.md works: its python blocks, run as one script on a fresh
clone's environment, record a LangChain agent and train it.

The page's blocks run in page order as one script in a fresh subprocess, in an empty
temporary directory, with every ``AGL_*`` variable cleared, as a user who pasted them into
one file would run them. The script's own asserts check what the page promises (two steps,
model version ``step-2``, the LangChain spans named by the agent, the gateway's token ids);
this test also checks the files the page tells the user to look at.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started" / "first-agent.md"

pytestmark = pytest.mark.slow

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The bodies of the page's ```python blocks, in page order."""
    return [body for language, body in _FENCE.findall(text) if language == "python"]


def test_python_blocks_are_found_in_page_order():
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 5, "the page's steps are python blocks"
    assert "AglCallbackHandler" in blocks[0]
    assert "Trainer(config).fit" in "\n".join(blocks)


def test_the_page_records_and_trains_a_langchain_agent(tmp_path):
    script = tmp_path / "first_agent.py"
    script.write_text("\n\n".join(python_blocks(PAGE.read_text())))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)})
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "2 steps; model version step-2" in proc.stdout
    workdir = tmp_path / "runs" / "first-agent"
    assert (workdir / "agl.db").is_file(), "the store the page's dashboard command opens"
    assert (workdir / "metrics.jsonl").read_text().count("\n") >= 2
