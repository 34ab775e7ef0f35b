"""Every code block of the documentation (docs/**/*.md and README.md) runs, or says why not.

The rules are in docs/_hooks/agl_docs/snippets.py. One test per page; the blocks a page does
not run are recorded with their reasons as the test's ``not_run`` property (junit XML).
"""

from __future__ import annotations

import pytest
from agl_docs.snippets import plan, run_page

from tests.docs.conftest import ROOT

OWN_TESTS = {ROOT / "docs" / "getting-started" / "first-agent.md": "tests/docs/test_first_agent_page.py"}
"""Pages run by a test of their own, which checks more than that the blocks run."""
PAGES = [
    p
    for p in sorted(p for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts) + [ROOT / "README.md"]
    if p not in OWN_TESTS
]


def _param(path):
    name = path.relative_to(ROOT).as_posix()
    page = plan(path.read_text(), name)
    runs = page.python or page.shell
    return pytest.param(path, id=name, marks=[pytest.mark.slow] if runs else [])


@pytest.mark.parametrize("path", [_param(p) for p in PAGES])
def test_page_snippets(path, record_property):
    report = run_page(path, ROOT)
    record_property("not_run", report.skipped)
