"""``agl engine`` (registered by agl-verl through ``agl_register_commands``) as real processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

AGL = str(Path(sys.executable).parent / "agl")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_") or k == "AGL_MODEL_CACHE"}
    return env | {"HF_HUB_OFFLINE": "1"} | extra


def _agl(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([AGL, *args], capture_output=True, text=True, timeout=timeout, env=env or _env())


def _start(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """Start ``agl engine serve`` and read its output up to the engine's ``serving`` line."""
    proc = subprocess.Popen(
        [AGL, "engine", "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    out, end = "", time.monotonic() + timeout
    while not out.endswith("\n") or "serving http" not in out.splitlines()[-1]:
        line = proc.stdout.readline()
        if not line or time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"the engine did not start: {out}{proc.stdout.read()}")
        out += line
    return proc, out


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def _models(port: int, token: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_agl_engine_lists_its_actions():
    out = _agl("engine", "--help", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "serve" in out.stdout and "model-path" in out.stdout
    top = _agl("--help", timeout=60)
    assert "engine" in top.stdout


def test_model_path_prints_the_smollm2_directory():
    out = _agl("engine", "model-path", "smollm2")
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.is_dir() and (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    bad = _agl("engine", "model-path", "gpt-5", timeout=60)
    assert bad.returncode == 2 and "preset" in bad.stderr and "smollm2" in bad.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--model: give a model directory with --model PATH or a bundled one with --preset smollm2"),
        (["--model", "/nonexistent/model"], "--model: /nonexistent/model is not a Hugging Face model directory"),
        (["--preset", "smollm2", "--port", "70000"], "--port: 70000 is not a TCP port"),
        (["--preset", "smollm2", "--replicas", "0"], "--replicas: must be at least 1, got 0"),
        (["--preset", "smollm2", "--max-batch-size", "0"], "--max-batch-size: must be at least 1, got 0"),
        (["--preset", "smollm2", "--threads", "0"], "--threads: must be at least 1, got 0"),
        (["--preset", "smollm2", "--engine-token", " "], "--engine-token: must not be empty"),
        (
            ["--preset", "smollm2", "--engine-token", "t", "--engine-token-file", "/x"],
            "--engine-token: give the token or a file holding it, not both",
        ),
        (["--preset", "smollm2", "--engine-token-file", "/nonexistent/t"], "--engine-token-file: cannot read"),
    ],
)
def test_bad_serve_arguments_are_one_line_errors_naming_the_flag(args, message):
    out = _agl("engine", "serve", *args, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith(f"agl: error: {message}")
    assert out.stderr.count("\n") == 1


def test_the_server_module_takes_the_same_options_and_checks():
    """``python -m agl_verl.engines.server`` is ``agl engine serve`` by another name: one parser, one check."""
    module = [sys.executable, "-m", "agl_verl.engines.server"]
    helps = [
        subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env()).stdout
        for cmd in ([*module, "--help"], [AGL, "engine", "serve", "--help"])
    ]
    options = [sorted(word.strip(",[]") for word in text.split() if word.startswith("--")) for text in helps]
    assert options[0] == options[1] and "--engine-token-file" in options[0], helps
    bad = subprocess.run(
        [*module, "--preset", "smollm2", "--replicas", "0"], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert bad.returncode == 2 and bad.stderr.strip().endswith("error: --replicas: must be at least 1, got 0")


@pytest.mark.slow
def test_serve_a_model_with_the_token_from_the_variable_the_gateway_reads(tiny_model_dir):
    port = free_port()
    proc, out = _start(["--model", str(tiny_model_dir), "--port", str(port)], _env(AGL_ENGINE_API_KEY="eng-key"))
    try:
        assert "token from $AGL_ENGINE_API_KEY" in out and "eng-key" not in out
        assert f"agl gateway serve --upstream http://127.0.0.1:{port}/v1" in out
        assert _models(port, "eng-key").status_code == 200
        assert _models(port, "wrong").status_code == 401
    finally:
        assert "agl engine: stopped" in _stop(proc)


@pytest.mark.slow
def test_serve_with_the_token_from_a_file_keeps_it_out_of_argv_and_output(tiny_model_dir, tmp_path):
    port = free_port()
    (tmp_path / "engine-token").write_text("file-key\n")
    args = ["--model", str(tiny_model_dir), "--port", str(port), "--engine-token-file", str(tmp_path / "engine-token")]
    proc, out = _start(args, _env(AGL_ENGINE_API_KEY="not-this-one"))
    try:
        assert "token from --engine-token-file" in out and "file-key" not in out
        assert _models(port, "file-key").status_code == 200
        assert _models(port, "not-this-one").status_code == 401
    finally:
        _stop(proc)


@pytest.mark.slow
def test_serve_without_a_token_makes_one_up_and_prints_it(tiny_model_dir):
    port = free_port()
    proc, out = _start(["--model", str(tiny_model_dir), "--port", str(port)], _env())
    try:
        (line,) = [line for line in out.splitlines() if line.startswith("agl engine: token ")]
        token = line.split()[3]
        assert len(token) >= 24
        assert _models(port, token).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    finally:
        _stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("threads", "policy", "said"),
    [
        ("1", None, "1 CPU threads, OMP_WAIT_POLICY=PASSIVE"),
        ("2", "active", "2 CPU threads, OMP_WAIT_POLICY=active"),
    ],
)
def test_serve_says_how_many_threads_it_runs_and_how_they_wait(tiny_model_dir, threads, policy, said):
    port = free_port()
    env = {k: v for k, v in _env(AGL_ENGINE_API_KEY="k").items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    proc, out = _start(["--model", str(tiny_model_dir), "--port", str(port), "--threads", threads], env)
    try:
        assert said in out.splitlines()[0], out
        assert _models(port, "k").status_code == 200
    finally:
        _stop(proc)


@pytest.mark.slow
def test_serve_the_smollm2_preset_answers_models():
    port = free_port()
    proc, out = _start(["--preset", "smollm2", "--port", str(port), "--engine-token", "t0k"], _env(), timeout=300)
    try:
        assert "smollm2-135m-instruct" in out and "token from --engine-token" in out
        r = _models(port, "t0k")
        assert r.status_code == 200 and r.json()["data"][0]["max_model_len"] == 8192
    finally:
        _stop(proc)
