"""``agl store stats``, ``agl rollouts list|show`` and ``agl spans list`` over a real store."""

from __future__ import annotations

import pytest

from agl.credentials import new_token
from agl.schema import Reward, Rollout, RolloutStatus, Span, Task
from agl.store.sqlite import SqliteStore
from agl_trainer.cli import main
from agl_trainer.store_server import ServerThread
from tests.conftest import wait_until_serving


@pytest.fixture
def filled(tmp_path):
    """A SQLite store with two rollouts: one finished with a span tree and rewards."""
    path = tmp_path / "agl.db"
    store = SqliteStore(path)
    store.add_tasks([Task(task_id="task-a", input={"q": "2+2"}), Task(task_id="task-b", input={"q": "3+3"})])
    done, waiting = store.enqueue([Rollout(task_id="task-a", step=3), Rollout(task_id="task-b")])
    store.claim("runner-1")
    root = Span(
        span_id="sp-root",
        rollout_id=done.rollout_id,
        seq=0,
        name="solve",
        kind="agent",
        attributes={"gen_ai.agent.name": "solver"},
        end_time=None,
    )
    chat = Span(
        span_id="sp-chat",
        parent_id="sp-root",
        rollout_id=done.rollout_id,
        seq=1,
        name="chat",
        kind="llm",
        attributes={"gen_ai.response.id": "chatcmpl-1"},
    )
    tool = Span(
        span_id="sp-tool", parent_id="sp-chat", rollout_id=done.rollout_id, seq=2, name="calculator", kind="tool"
    )
    store.add_spans([root, chat, tool])
    store.add_rewards(
        [
            Reward(rollout_id=done.rollout_id, value=1.0),
            Reward(rollout_id=done.rollout_id, span_id="sp-chat", name="format", value=0.5),
        ]
    )
    store.finish(done.rollout_id, RolloutStatus.SUCCEEDED, output="4")
    yield store, f"sqlite:///{path}", done, waiting
    store.close()


def _lines(out: str) -> list[str]:
    return [line.rstrip() for line in out.splitlines()]


def test_store_stats(filled, capsys):
    _, url, _, _ = filled
    assert main(["store", "stats", "--store", url]) == 0
    out = capsys.readouterr().out
    assert any("tasks" in line and line.split("│")[2].strip() == "2" for line in _lines(out) if "│" in line)
    assert "rollouts succeeded" in out and "rollouts queued" in out
    spans_row = next(line for line in _lines(out) if "│ spans" in line)
    assert spans_row.split("│")[2].strip() == "3"


def test_rollouts_list_filters(filled, capsys, monkeypatch):
    _, url, done, waiting = filled
    monkeypatch.setenv("AGL_STORE_URL", url)  # the store comes from the environment
    assert main(["rollouts", "list"]) == 0
    out = capsys.readouterr().out
    assert done.rollout_id in out and waiting.rollout_id in out and "2 rollout(s)" in out
    assert main(["rollouts", "list", "--status", "queued"]) == 0
    out = capsys.readouterr().out
    assert waiting.rollout_id in out and done.rollout_id not in out
    assert main(["rollouts", "list", "--task", "task-a"]) == 0
    out = capsys.readouterr().out
    assert done.rollout_id in out and "1 rollout(s)" in out
    assert main(["rollouts", "list", "--limit", "1"]) == 0
    assert "1 rollout(s)" in capsys.readouterr().out
    assert main(["rollouts", "list", "--status", "sleeping"]) == 2
    assert "--status" in capsys.readouterr().err


def test_rollouts_show_prints_the_span_tree_with_rewards(filled, capsys):
    _, url, done, _ = filled
    assert main(["rollouts", "show", done.rollout_id, "--store", url]) == 0
    lines = _lines(capsys.readouterr().out)
    text = "\n".join(lines)
    assert "succeeded" in text and "runner-1" in text
    root = next(i for i, line in enumerate(lines) if "solve sp-root" in line)
    chat = next(i for i, line in enumerate(lines) if "chat sp-chat" in line)
    tool = next(i for i, line in enumerate(lines) if "calculator sp-tool" in line)
    assert root < chat < tool

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip(" │├└─"))

    assert indent(lines[root]) < indent(lines[chat]) < indent(lines[tool])
    assert "reward format=0.5" in lines[chat]
    assert "response.id=chatcmpl-1" in lines[chat]
    assert any("(rollout)" in line and "1" in line for line in lines)


def test_rollouts_show_unknown_id_is_a_clear_error(filled, capsys):
    _, url, _, _ = filled
    assert main(["rollouts", "show", "ro-missing", "--store", url]) == 2
    assert "unknown rollout 'ro-missing'" in capsys.readouterr().err


def test_spans_list_over_http(filled, capsys):
    store, _, done, _ = filled
    token = new_token(8)
    with ServerThread(store, token=token) as server:
        assert (
            main(["spans", "list", "--rollout", done.rollout_id, "--store", server.url, f"--store-token={token}"]) == 0
        )
        out = capsys.readouterr().out
        rows = [line for line in _lines(out) if "│" in line and "sp-" in line]
        assert [row.split("│")[2].strip() for row in rows] == ["sp-root", "sp-chat", "sp-tool"]
        assert "3 span(s)" in out
        assert (
            main(
                [
                    "spans",
                    "list",
                    "--rollout",
                    done.rollout_id,
                    "--kind",
                    "tool",
                    "--store",
                    server.url,
                    f"--store-token={token}",
                ]
            )
            == 0
        )
        assert "1 span(s)" in capsys.readouterr().out
        assert main(["spans", "list", "--rollout", "ro-nope", "--store", server.url, f"--store-token={token}"]) == 2
        assert "unknown rollout" in capsys.readouterr().err
        assert main(["store", "stats", "--store", server.url, "--store-token", "wrong"]) == 2
        assert "wrong bearer token" in capsys.readouterr().err


def test_store_serve_without_a_token_prints_a_new_one(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    from agl.store.http import HttpStore
    from tests.conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("AGL_STORE_TOKEN", "AGL_STORE_URL")}
    code = "import sys; from agl_trainer.cli import main; sys.exit(main())"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "store",
            "serve",
            "--store",
            f"sqlite:///{tmp_path / 'agl.db'}",
            "--port",
            str(port),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert "AGL_STORE_TOKEN=" in first
        token = first.split("AGL_STORE_TOKEN=")[1].strip(" )\n")
        assert len(token) >= 24
        assert "serving SqliteStore" in (second := proc.stdout.readline()) and f"http://127.0.0.1:{port}" in second
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(f"{url}/healthz", proc)
        assert httpx.get(f"{url}/v1/stats").status_code == 401
        with HttpStore(url, token=token) as store:
            assert store.stats().spans == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
