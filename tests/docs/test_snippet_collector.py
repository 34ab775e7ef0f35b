"""The snippet collector (docs/_hooks/agl_docs/snippets.py) on small synthetic pages."""

from __future__ import annotations

from pathlib import Path

import pytest
from agl_docs import snippets
from agl_docs.snippets import SnippetError, run_page


def page(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_unmarked_block_fails_naming_file_and_line(tmp_path):
    path = page(tmp_path, "# T\n\ntext\n```bash\nagl --help\n```\n\n```\nplain\n```\n")
    with pytest.raises(SnippetError) as failed:
        run_page(path, tmp_path)
    message = str(failed.value)
    assert "page.md:4: a bash block needs <!-- run --> or <!-- not run: REASON -->" in message
    assert "page.md:8: a plain block needs <!-- not run: REASON -->" in message


def test_a_not_run_block_is_skipped_with_its_reason(tmp_path):
    path = page(
        tmp_path,
        "<!-- not run: starts a server for minutes -->\n```python\nraise SystemExit(3)\n```\n\n"
        "<!-- not run: a picture -->\n```text\n[agent] -> [gateway]\n```\n",
    )
    report = run_page(path, tmp_path)
    assert report.skipped == [("page.md:2", "starts a server for minutes"), ("page.md:7", "a picture")]
    assert report.ran == []


def test_a_not_run_marker_needs_a_reason(tmp_path):
    path = page(tmp_path, "<!-- not run: -->\n```python\nx = 1\n```\n")
    with pytest.raises(SnippetError, match=r"page.md:2: <!-- not run: REASON --> needs a reason"):
        run_page(path, tmp_path)


def test_a_marker_not_before_a_fence_is_an_error(tmp_path):
    path = page(tmp_path, "<!-- run -->\n\n```bash\necho hi\n```\n")
    with pytest.raises(SnippetError) as failed:
        run_page(path, tmp_path)
    assert "page.md:1: marker <!-- run --> is not directly before a code block" in str(failed.value)
    assert "page.md:3: a bash block needs" in str(failed.value)


def test_a_failing_python_block_fails_naming_the_line(tmp_path):
    path = page(tmp_path, "# T\n\n```python\nx = 1\n```\n\nprose\n\n```python\ny = x + 1\nassert y == 3, y\n```\n")
    with pytest.raises(SnippetError) as failed:
        run_page(path, tmp_path)
    assert str(failed.value).startswith("page.md:11: python block failed (exit 1)")
    assert "AssertionError: 2" in str(failed.value)


def test_python_blocks_share_one_script_in_a_temp_dir_without_agl_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("AGL_STORE_URL", "sqlite:///should-not-leak.db")
    path = page(
        tmp_path,
        "```python\nimport os, pathlib\nseen = sorted(k for k in os.environ if k.startswith('AGL_'))\n```\n\n"
        "```py\nassert seen == [], seen\nassert pathlib.Path.cwd() != pathlib.Path(" + repr(str(tmp_path)) + ")\n"
        "import agl, agl_trainer\nassert agl_trainer.TrainerConfig().steps >= 1\n```\n",
    )
    report = run_page(path, tmp_path)
    assert report.ran == ["page.md:1", "page.md:6"]


def test_marked_shell_blocks_run_and_a_failing_command_names_its_block(tmp_path):
    ok = page(tmp_path, "<!-- run -->\n```console\n$ echo one\none\n$ test -d docs || true\n```\n", "ok.md")
    assert run_page(ok, tmp_path).ran == ["ok.md:2"]
    bad = page(tmp_path, "<!-- run -->\n```bash\n# a comment\n$ true\nfalse \\\n  --flag\n```\n", "bad.md")
    with pytest.raises(SnippetError, match=r"bad.md:2: `false --flag` exited 1"):
        run_page(bad, tmp_path)


def test_console_blocks_run_only_their_dollar_lines():
    block = snippets.Block("p.md:1", 1, "console", "$ agl --help\nusage: agl ...\n$ agl plugins \\\n  --json\n", "run")
    assert snippets.commands(block) == ["agl --help", "agl plugins --json"]


def test_shell_commands_run_in_the_repository_root_with_the_venv_first(tmp_path):
    (tmp_path / "marker-file").write_text("")
    path = page(tmp_path, "<!-- run -->\n```sh\ntest -f marker-file\ncommand -v agl\n```\n")
    assert run_page(path, tmp_path).ran == ["page.md:2"]


def test_config_blocks_are_validated_as_trainer_configs(tmp_path):
    good = page(tmp_path, "<!-- run: config -->\n```yaml\nsteps: 3\nrollout: {concurrency: 2}\n```\n", "good.md")
    assert run_page(good, tmp_path).ran == ["good.md:2"]
    bad = page(tmp_path, "<!-- run: config -->\n```yaml\nsteps: 3\nrollout: {concurency: 2}\n```\n", "bad.md")
    with pytest.raises(SnippetError, match=r"bad.md:2: rollout.concurency: not a config key \(did you mean"):
        run_page(bad, tmp_path)


def test_an_unmarked_yaml_block_and_a_misapplied_marker_fail(tmp_path):
    path = page(tmp_path, "```yaml\nsteps: 3\n```\n\n<!-- run: config -->\n```python\nx = 1\n```\n")
    with pytest.raises(SnippetError) as failed:
        run_page(path, tmp_path)
    assert "page.md:1: a yaml block needs <!-- run: config --> or <!-- not run: REASON -->" in str(failed.value)
    assert "page.md:6: <!-- run: config --> does not apply to a python block" in str(failed.value)


def test_a_longer_fence_holds_a_shorter_one_and_indented_blocks_count(tmp_path):
    text = (
        "<!-- not run: shows how a page is written -->\n````markdown\n```python\nraise SystemExit(1)\n```\n````\n\n"
        "1. a step\n\n    ```python\n    value = 41 + 1\n    ```\n"
    )
    found, problems = snippets.blocks(text, "p.md")
    assert problems == []
    assert [(b.where, b.lang) for b in found] == [("p.md:2", "markdown"), ("p.md:10", "python")]
    assert found[1].code == "value = 41 + 1"
    assert run_page(page(tmp_path, text), tmp_path).ran == ["page.md:10"]
