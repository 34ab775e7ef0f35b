"""``agl gateway serve`` as a process: serves, records, stops on SIGTERM with a summary."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from agl.store.sqlite import SqliteStore
from tests.conftest import free_port

AGL = str(Path(sys.executable).parent / "agl")


def test_serve_records_and_stops_cleanly(tmp_path, engine):
    db = tmp_path / "agl.db"
    port = free_port()
    proc = subprocess.Popen(
        [
            AGL,
            "gateway",
            "serve",
            "--store",
            f"sqlite:///{db}",
            "--upstream",
            engine.url,
            "--port",
            str(port),
            "--token",
            "tok",
            "--model-version",
            "v9",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert f"serving http://127.0.0.1:{port}/v1" in line, line
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": "Bearer tok"},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert r.status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "stopped after recording 1 calls" in out
    with SqliteStore(db) as store:
        [call] = store.query_llm_calls(production=True)
    assert call.call_id == r.json()["id"] and call.model_version == "v9"


def test_bad_arguments_are_named(tmp_path):
    out = subprocess.run(
        [
            AGL,
            "gateway",
            "serve",
            "--store",
            f"sqlite:///{tmp_path}/a.db",
            "--upstream",
            "ftp://x",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 2 and "upstream" in out.stderr and "ftp://x" in out.stderr
    out = subprocess.run(
        [AGL, "gateway", "serve", "--upstream", "http://127.0.0.1:1/v1", "--max-in-flight", "0"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 2 and "--max-in-flight" in out.stderr
