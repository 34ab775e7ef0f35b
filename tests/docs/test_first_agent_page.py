"""docs/getting-started/first-agent.md works: its python blocks, run as one script on a fresh
clone's environment, record a LangChain agent and train it.

The page's blocks run through the documentation's snippet rules (:mod:`agl_docs.snippets`: in
page order, one script, a fresh subprocess, every ``AGL_*`` variable cleared), as a user who
pasted them into one file would run them, here in the test's own directory so that the files
the page tells the user to look at can be checked too. The script's own asserts check what the
page promises (two steps, model version ``step-2``, the LangChain spans named by the agent, the
gateway's token ids). This is the page's test; tests/docs/test_snippets.py leaves it to this one.
"""

from __future__ import annotations

import pytest
from agl_docs.snippets import plan, run_python

from tests.docs.conftest import ROOT

PAGE = ROOT / "docs" / "getting-started" / "first-agent.md"

pytestmark = pytest.mark.slow


def test_the_page_records_and_trains_a_langchain_agent(tmp_path):
    page = plan(PAGE.read_text(), "docs/getting-started/first-agent.md")
    assert not page.problems and len(page.python) >= 5, "the page's steps are python blocks"
    assert "AglCallbackHandler" in page.python[0].code
    out = run_python(page.python, ROOT, timeout_s=600, cwd=tmp_path)
    assert "2 steps; model version step-2" in out
    workdir = tmp_path / "runs" / "first-agent"
    assert (workdir / "agl.db").is_file(), "the store the page's dashboard command opens"
    assert (workdir / "metrics.jsonl").read_text().count("\n") >= 2
