"""The site's strict build fails on what it should: a broken link or anchor, a reference page
that is not there. Each test builds a tiny site with the project's own settings (mkdocs.yml's
strictness, validation, Markdown extensions and hooks) in a temporary directory."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort, PluginError

import agl_trainer.cli
from tests.docs.conftest import ROOT


def tiny_site(tmp_path: Path, pages: dict[str, str], *, hooks: bool = True) -> Path:
    """A site in ``tmp_path`` with the project's settings (no nav, no API pages) and ``pages``."""
    real = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert real["strict"] is True
    config = {
        "site_name": "tiny",
        "docs_dir": "docs",
        "site_dir": "site",
        "strict": True,
        "validation": real["validation"],
        "markdown_extensions": real["markdown_extensions"],
        "theme": {"name": "mkdocs"},
        "hooks": [str(ROOT / h) for h in real["hooks"]] if hooks else [],
    }
    for name, text in pages.items():
        (tmp_path / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / name).write_text(text)
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def build_in_process(config_file: Path, caplog) -> list[str]:
    """Build the site; the warnings it logged (a strict build that has any raises Abort)."""
    caplog.set_level(logging.WARNING, logger="mkdocs")
    build(load_config(str(config_file)))
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_broken_link_makes_mkdocs_exit_non_zero(tmp_path):
    config = tiny_site(tmp_path, {"index.md": "# Home\n\nSee [the guide](guide/missing.md).\n"}, hooks=False)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)],
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode != 0
    assert "contains a link 'guide/missing.md', but the target is not found" in done.stderr
    assert "Aborted with 1 warnings in strict mode" in done.stdout + done.stderr


def test_a_broken_anchor_fails_the_build(tmp_path, caplog):
    config = tiny_site(tmp_path, {"index.md": "# Home\n\n[hooks](reference/hooks.md#agl_no_such_hook)\n"})
    with pytest.raises(Abort):
        build_in_process(config, caplog)
    assert any("#agl_no_such_hook" in message for message in caplog.messages)


def test_links_into_the_generated_references_resolve(tmp_path, caplog):
    links = "[train](reference/cli.md#agl-train) [steps](reference/config.md) [reward](reference/hooks.md#agl_reward)"
    config = tiny_site(tmp_path, {"index.md": f"# Home\n\n{links} [env](reference/environment.md)\n"})
    assert build_in_process(config, caplog) == []
    site = tmp_path / "site" / "reference"
    assert "AGL_STORE_URL" in (site / "environment" / "index.html").read_text()


def test_a_missing_reference_fails_the_build(tmp_path, caplog):
    config = tiny_site(tmp_path, {"index.md": "# Home\n\n[flags](reference/cli.md)\n"}, hooks=False)
    with pytest.raises(Abort):
        build_in_process(config, caplog)
    assert any("reference/cli.md" in message for message in caplog.messages)


def test_a_flag_added_in_a_fixture_appears_in_the_built_page(tmp_path, caplog, monkeypatch):
    real = agl_trainer.cli.build_parser

    def with_probe() -> argparse.ArgumentParser:
        parser = real()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices["train"].add_argument("--docs-probe-flag", help="added by a test fixture")
        return parser

    monkeypatch.setattr(agl_trainer.cli, "build_parser", with_probe)
    config = tiny_site(tmp_path, {"index.md": "# Home\n\n[flags](reference/cli.md#agl-train)\n"})
    build_in_process(config, caplog)
    html = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "<code>--docs-probe-flag DOCS_PROBE_FLAG</code>" in html
    assert "added by a test fixture" in html


def test_a_committed_copy_of_a_generated_page_is_refused(tmp_path, caplog):
    config = tiny_site(tmp_path, {"index.md": "# Home\n", "reference/cli.md": "# stale copy\n"})
    with pytest.raises(Abort) as aborted:
        build_in_process(config, caplog)
    assert isinstance(aborted.value.__context__, PluginError)
    assert "docs/reference/cli.md is generated at build time" in str(aborted.value.__context__)
