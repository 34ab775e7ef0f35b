"""``agl gateway serve`` as a process: serves, records, stops on SIGTERM with a summary; its token and
the engine's key come from the variables ``agl run`` and ``agl engine serve`` read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from agl.store.sqlite import SqliteStore
from tests.conftest import free_port
from tests.fake_engine import FakeEngine

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
            "--gateway-token",
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


def _serve(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, list[str]]:
    """Start `agl gateway serve` and read its lines up to the one `agl run` copies from."""
    proc = subprocess.Popen(
        [AGL, "gateway", "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines = []
    while not lines or "for agl run" not in lines[-1]:
        line = proc.stdout.readline()
        assert line, f"the gateway exited: {''.join(lines)}"
        lines.append(line)
    return proc, lines


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    return out


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    return env | extra


def test_token_and_engine_key_come_from_the_variables_agl_run_and_agl_engine_read(tmp_path):
    port = free_port()
    with FakeEngine(api_key="engine-key") as engine:
        env = _clean_env(AGL_GATEWAY_TOKEN="from-env-token", AGL_ENGINE_API_KEY="engine-key")
        proc, lines = _serve(
            ["--store", f"sqlite:///{tmp_path}/a.db", "--upstream", engine.url, "--port", str(port)], env
        )
        try:
            text = "".join(lines)
            assert "token from $AGL_GATEWAY_TOKEN" in text and "from-env-token" not in text
            assert "admin token " in text  # made up: printed, since nobody else knows it
            assert f"export AGL_GATEWAY_URL=http://127.0.0.1:{port} AGL_ROLLOUT_KEY_SECRET=" in text
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            ok = httpx.post(url, headers={"Authorization": "Bearer from-env-token"}, json=body, timeout=10)
            assert ok.status_code == 200, ok.text  # the engine took AGL_ENGINE_API_KEY as the upstream key
            assert httpx.post(url, headers={"Authorization": "Bearer agl"}, json=body, timeout=10).status_code == 401
        finally:
            out = _stop(proc)
    assert "stopped after recording 1 calls" in out


def test_without_a_token_a_random_one_is_printed_with_the_line_for_agl_run(tmp_path, engine):
    port = free_port()
    env = _clean_env()
    proc, lines = _serve(["--store", f"sqlite:///{tmp_path}/a.db", "--upstream", engine.url, "--port", str(port)], env)
    try:
        (token_line,) = [line for line in lines if "agl gateway: token " in line]
        token = token_line.split()[3]
        assert len(token) >= 24 and token != "agl"
        assert f"export AGL_GATEWAY_URL=http://127.0.0.1:{port} AGL_ROLLOUT_KEY_SECRET=" in lines[-1]
        models = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(models, headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code == 200
        assert httpx.get(models, headers={"Authorization": "Bearer agl"}, timeout=10).status_code == 401
    finally:
        _stop(proc)


def test_an_empty_token_is_refused(tmp_path):
    out = subprocess.run(
        [AGL, "gateway", "serve", "--upstream", "http://127.0.0.1:1/v1", "--gateway-token", " "],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 2 and "--gateway-token: must not be empty" in out.stderr


def test_tokens_and_the_key_secret_come_from_files_and_each_opens_its_own_routes(tmp_path, engine):
    from agl.credentials import RolloutKeys
    from agl.schema import Rollout, Task

    secret = "gateway-key-secret-0123456789abcdef"
    for name, value in {"token": "prod-token-from-file", "admin": "admin-token-from-file", "secret": secret}.items():
        (tmp_path / name).write_text(value + "\n")
    db = tmp_path / "agl.db"
    store = SqliteStore(db)
    store.add_tasks([Task(task_id="t", input={})])
    store.enqueue([Rollout(rollout_id="ro-1", task_id="t")])
    (claimed,) = store.claim("runner")
    port = free_port()
    args = ["--store", f"sqlite:///{db}", "--upstream", engine.url, "--port", str(port)]
    args += ["--gateway-token-file", str(tmp_path / "token"), "--admin-token-file", str(tmp_path / "admin")]
    args += ["--rollout-key-secret-file", str(tmp_path / "secret")]
    proc, lines = _serve(args, _clean_env())
    try:
        text = "".join(lines)
        assert "from-file" not in text and secret not in text  # nothing that came from a file is printed
        url = f"http://127.0.0.1:{port}"

        def post(path: str, credential: str, body: dict) -> int:
            headers = {"Authorization": f"Bearer {credential}"}
            return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=10).status_code

        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        key = RolloutKeys(secret).mint("ro-1", claimed.attempt)
        assert post("/rollouts/ro-1/v1/chat/completions", key, chat) == 200
        assert post("/v1/chat/completions", "prod-token-from-file", chat) == 200
        assert post("/rollouts/ro-1/v1/chat/completions", "prod-token-from-file", chat) == 403
        assert post("/admin/model_version", "prod-token-from-file", {"model_version": "x"}) == 403
        assert post("/admin/model_version", key, {"model_version": "x"}) == 403
        assert post("/admin/model_version", "admin-token-from-file", {"model_version": "x"}) == 200
    finally:
        _stop(proc)
        store.close()


def test_a_gateway_in_front_of_a_store_server_sends_it_the_store_token_not_its_own(tmp_path, engine):
    """issue 32: the agl run page's recipe exports AGL_GATEWAY_TOKEN; the gateway must still send the store server
    the store's token (AGL_STORE_TOKEN here), so that its calls are recorded and rollout keys work."""
    from agl.credentials import RolloutKeys
    from agl.schema import Rollout, Task
    from agl_trainer.store_server import ServerThread

    secret = "gateway-key-secret-0123456789abcdef"
    (tmp_path / "secret").write_text(secret)
    backing = SqliteStore(tmp_path / "agl.db")
    backing.add_tasks([Task(task_id="t", input={})])
    backing.enqueue([Rollout(rollout_id="ro-1", task_id="t")])
    (claimed,) = backing.claim("runner")
    port = free_port()
    with ServerThread(backing, token="store-admin-token") as server:
        env = _clean_env(AGL_GATEWAY_TOKEN="gateway-token", AGL_STORE_TOKEN="store-admin-token")
        args = ["--store", server.url, "--upstream", engine.url, "--port", str(port)]
        proc, _ = _serve([*args, "--rollout-key-secret-file", str(tmp_path / "secret")], env)
        try:
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

            def post(path: str, credential: str) -> httpx.Response:
                headers = {"Authorization": f"Bearer {credential}"}
                return httpx.post(f"http://127.0.0.1:{port}{path}", json=chat, headers=headers, timeout=10)

            assert post("/v1/chat/completions", "gateway-token").status_code == 200
            key = RolloutKeys(secret).mint("ro-1", claimed.attempt)
            answer = post("/rollouts/ro-1/v1/chat/completions", key)
            assert answer.status_code == 200, answer.text
        finally:
            out = _stop(proc)
        assert "stopped after recording 2 calls" in out
        recorded = {call.rollout_id for call in backing.query_llm_calls()}
    backing.close()
    assert recorded == {None, "ro-1"}
