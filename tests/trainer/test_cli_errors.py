"""A user's first hour with ``agl``: one default store, read-only commands that create nothing,
one-line errors naming what to fix (``--debug`` for the traceback), and tokens of any shape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import agl
from agl.credentials import new_token
from agl.plugins import register, unregister
from agl.schema import Task
from agl.store.base import sqlite_url
from agl.store.sqlite import SqliteStore
from agl_trainer.cli import build_parser, join_token_values, main
from agl_trainer.config import TrainerConfig
from agl_trainer.store_server import ServerThread

REPO = Path(__file__).resolve().parents[2]
FORMS = "sqlite:///relative/path.db or sqlite:////absolute/path.db"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory and no store named by the environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("AGL_STORE_URL", "AGL_GATEWAY_URL", "AGL_GATEWAY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _agl(*args: str, cwd: Path, env: dict[str, str] | None = None, prelude: str = ""):
    """``agl ARGS`` in a fresh process (``prelude`` runs first), as a CompletedProcess with text output."""
    code = f"import sys\n{prelude}\nfrom agl_trainer.cli import main\nsys.exit(main())"
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # keep a checkout's own paths
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=base | {"PYTHONPATH": path} | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_error(stderr: str) -> str:
    """The error line, checking that it is the only thing on stderr that is not the trainer's logging."""
    lines = [line for line in stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    assert len(lines) == 1 and lines[0].startswith("agl: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0].removeprefix("agl: error: ")


@pytest.fixture
def train_dir(tmp_path):
    """A directory with an agent file and a tasks file, as a user has them for ``agl train``."""
    (tmp_path / "agent.py").write_text("def agent(task, ctx):\n    return None\n")
    (tmp_path / "tasks.jsonl").write_text('{"input": {"answer": 1}}\n')
    return tmp_path


# -- one default store --------------------------------------------------------------
def test_agl_run_and_agl_rollouts_and_the_trainer_share_one_default_store(workdir, capsys):
    assert main(["run", "--", sys.executable, "-c", "pass"]) == 0
    assert (workdir / ".agl" / "agl.db").is_file()
    capsys.readouterr()
    assert main(["rollouts", "list"]) == 0
    assert "1 rollout(s)" in capsys.readouterr().out
    assert TrainerConfig(workdir="runs/elsewhere").store_url() == sqlite_url(workdir / ".agl" / "agl.db")


def test_agl_store_url_comes_first_for_the_trainer_too(workdir, monkeypatch):
    monkeypatch.setenv("AGL_STORE_URL", "sqlite:///team/agl.db")
    assert TrainerConfig().store_url() == sqlite_url(workdir / "team" / "agl.db")
    assert TrainerConfig(store="http://127.0.0.1:4317").store_url() == "http://127.0.0.1:4317"


# -- readers refuse a store that does not exist ---------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        ["rollouts", "list"],
        ["rollouts", "show", "ro-1"],
        ["spans", "list", "--rollout", "ro-1"],
        ["store", "stats"],
        ["export", "transitions", "-o", "out.jsonl"],
    ],
)
def test_a_read_only_command_refuses_a_missing_store_and_creates_nothing(command, workdir, capsys):
    assert main([*command, "--store", "sqlite:///nope/none.db"]) == 2
    assert _one_line_error(capsys.readouterr().err).startswith("no such store: nope/none.db (")
    assert main(command) == 2  # the default store, .agl/agl.db, does not exist either
    assert _one_line_error(capsys.readouterr().err).startswith("no such store: .agl/agl.db (")
    assert sorted(p.name for p in workdir.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:/x.db"])
def test_a_malformed_sqlite_url_names_the_expected_forms(url, workdir, capsys):
    assert main(["rollouts", "list", "--store", url]) == 2
    assert _one_line_error(capsys.readouterr().err) == f"store url {url!r}: a sqlite url is {FORMS}"


# -- one-line errors ------------------------------------------------------------------
def test_a_missing_tasks_file_is_named(train_dir):
    done = _agl("train", "agent.py:agent", "--tasks", "nope.jsonl", cwd=train_dir)
    assert done.returncode == 2
    assert _one_line_error(done.stderr) == "--tasks: nope.jsonl: no such file (a JSONL file, one task a line)"
    done = _agl("train", "agent.py:agent", "--tasks", "tasks.jsonl", "--val", ".", cwd=train_dir)
    assert done.returncode == 2 and _one_line_error(done.stderr).startswith("--val: .: is a directory")


def test_a_model_directory_without_config_json_is_named(train_dir):
    (train_dir / "my-model").mkdir()
    done = _agl(
        "train", "agent.py:agent", "--tasks", "tasks.jsonl", "--backend", "verl", "--model", "my-model", cwd=train_dir
    )
    assert done.returncode == 2
    error = _one_line_error(done.stderr)
    assert error.startswith(
        "engine transformers: model_path: my-model is not a model directory (it has no config.json)"
    )
    assert "agl engine model-path smollm2" in error


def test_agl_verl_without_torch_says_how_to_install_it(train_dir):
    (train_dir / "my-model").mkdir()
    (train_dir / "my-model" / "config.json").write_text("{}")
    done = _agl(
        *("train", "agent.py:agent", "--tasks", "tasks.jsonl", "--backend", "verl", "--model", "my-model"),
        cwd=train_dir,
        prelude="sys.modules['torch'] = None  # what `import torch` does where torch is not installed",
    )
    assert done.returncode == 2
    assert _one_line_error(done.stderr).startswith("agl-verl needs torch: pip install torch==")


def test_a_backend_no_installed_plugin_provides_names_the_package(train_dir):
    done = _agl(
        *("train", "agent.py:agent", "--tasks", "tasks.jsonl", "--backend", "verl"),
        "--set",
        "engine_urls=[http://127.0.0.1:9/v1]",
        cwd=train_dir,
        env={"AGL_LOAD_PLUGINS": ""},  # as if agl-verl were not installed
    )
    assert done.returncode == 2
    assert _one_line_error(done.stderr).startswith("no backend 'verl': pip install agl-verl")


class Boom:
    @agl.hookimpl
    def agl_register_commands(self, register):
        register("boom", lambda parser: parser.set_defaults(func=self.run))

    def run(self, args):
        raise RuntimeError("kaput\nin two lines")


@pytest.fixture
def boom():
    register(Boom(), name="test-boom")
    yield
    unregister(name="test-boom")


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(boom, capsys):
    assert main(["boom"]) == 1
    err = capsys.readouterr().err
    assert _one_line_error(err) == "RuntimeError: kaput in two lines (agl --debug ... shows the traceback)"
    for flag in ("--debug", "-v"):
        assert main([flag, "boom"]) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and err.rstrip().endswith("RuntimeError: kaput in two lines")


# -- tokens of any shape --------------------------------------------------------------
def test_token_flags_take_values_that_start_with_a_dash():
    parser = build_parser()
    args = parser.parse_args(join_token_values(["store", "stats", "--store-token", "-abc"]))
    assert args.store_token == "-abc"
    args = parser.parse_args(join_token_values(["store", "stats", "--store-token=-abc"]))
    assert args.store_token == "-abc"
    argv = ["store", "serve", "--admin-token", "-ad", "--runner-token", "-ru"]
    args = parser.parse_args(join_token_values(argv))
    assert (args.admin_token, args.runner_token) == ("-ad", "-ru")
    argv = ["gateway", "serve", "--gateway-token", "-gw", "--engine-token", "-up", "--admin-token", "-ad"]
    args = parser.parse_args(join_token_values([*argv, "--upstream", "http://127.0.0.1:1/v1"]))
    assert (args.gateway_token, args.engine_token, args.admin_token) == ("-gw", "-up", "-ad")
    argv = ["run", "--store-token", "-abc", "--", "tool", "--store-token", "-x"]
    assert join_token_values(argv) == ["run", "--store-token=-abc", "--", "tool", "--store-token", "-x"]
    args = parser.parse_args(join_token_values(argv))
    assert args.store_token == "-abc" and args.command[-3:] == ["tool", "--store-token", "-x"]
    args = parser.parse_args(join_token_values(["runner", "a:b", "--gateway-token", "-gw"]))
    assert args.gateway_token == "-gw"


def test_a_store_token_starting_with_a_dash_reaches_the_server(tmp_path, capsys):
    token = "-" + new_token(16)
    with SqliteStore(tmp_path / "agl.db") as backing, ServerThread(backing, token=token) as server:
        backing.add_tasks([Task(task_id="t", input={})])
        assert main(["store", "stats", "--store", server.url, "--store-token", token]) == 0
    assert "tasks" in capsys.readouterr().out


def test_new_tokens_never_start_with_a_dash(monkeypatch):
    made = iter(["-first", "--second", "third"])
    monkeypatch.setattr("agl.credentials.secrets.token_urlsafe", lambda nbytes: next(made))
    assert new_token() == "third"


def test_an_agl_variable_agl_does_not_read_is_warned_about_once(workdir):
    """``AGL_LANGCHAIN=1`` (the switch's old name) would do nothing silently: the command says so
    once, naming the switch, and goes on (to its error: no store here)."""
    done = _agl("rollouts", "list", cwd=workdir, env={"AGL_LANGCHAIN": "1", "AGL_FUZZ_SEED": "7"})
    line = "$AGL_LANGCHAIN is set but agl reads no such variable; did you mean $AGL_LANGCHAIN_INSTRUMENT?"
    assert done.stderr.count(line) == 1, done.stderr
    assert "AGL_FUZZ_SEED" not in done.stderr  # read by the test suite: known
    assert _one_line_error(done.stderr).startswith("no such store")


def test_a_users_own_agl_variable_draws_no_warning(workdir):
    """``AGL_REPO`` and ``AGL_VENV`` are a user's own names, nothing like agl's: ``agl plugins``
    runs as if they were unset, stderr empty."""
    done = _agl("plugins", cwd=workdir, env={"AGL_REPO": "x", "AGL_VENV": "/tmp/venv"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_misspelled_agl_variable_is_warned_about_once_naming_the_right_one(workdir):
    """``AGL_STORE_TOKN`` is one letter from ``AGL_STORE_TOKEN``: one warning naming it."""
    done = _agl("plugins", cwd=workdir, env={"AGL_STORE_TOKN": "x"})
    line = "$AGL_STORE_TOKN is set but agl reads no such variable; did you mean $AGL_STORE_TOKEN?"
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(line) == 1, done.stderr
    assert [w for w in done.stderr.splitlines() if w.strip() and line not in w] == []


@pytest.fixture
def taken_port():
    """A port another process's server listens on (a socket listening on it here)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(
    "command",
    [
        ["store", "serve"],
        ["dashboard"],
        ["gateway", "serve", "--upstream", "http://127.0.0.1:9/v1"],
        ["engine", "serve", "--model", "no-model-here"],
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_a_port_in_use_is_one_error_line_before_anything_is_created(workdir, taken_port, command, capsys):
    """No store file, no made-up token, no "serving" line: only the error naming the flag."""
    assert main([*command, "--port", str(taken_port)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"agl: error: --port {taken_port}: cannot listen on 127.0.0.1:{taken_port}: "
        "another process is listening there (stop it, or choose another port)"
    ]
    assert list(workdir.iterdir()) == []


def test_a_postgresql_store_that_does_not_answer_is_one_error_line(workdir):
    """No retry warnings before the error: the command tries briefly (about 2 s), then says so
    in one line that counts the retries; ``-v`` shows them."""
    import time

    from tests.conftest import free_port

    url = f"postgresql://agl@127.0.0.1:{free_port()}/agl"  # nothing listens there
    started = time.monotonic()
    done = _agl("rollouts", "list", "--store", url, cwd=workdir)
    took = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    error = _one_line_error(done.stderr)
    assert error.startswith(
        f"the postgresql store at 127.0.0.1:{url.rsplit(':', 1)[1]} is still unavailable after 3 retries"
    )
    assert "Connection refused" in error
    assert took < 10
    verbose = _agl("-v", "rollouts", "list", "--store", url, cwd=workdir)
    assert verbose.stderr.count("transient error") == 3


def test_a_plugin_that_does_not_import_is_named_by_the_flag_the_user_typed(train_dir, capsys, monkeypatch):
    """``--plugin nonexistent_module``, not ``plugins[0]`` (a name the user never wrote)."""
    monkeypatch.chdir(train_dir)
    code = main(["train", "agent.py:agent", "--tasks", "tasks.jsonl", "--plugin", "nonexistent_module"])
    assert code == 2
    error = _one_line_error(capsys.readouterr().err)
    assert error.startswith("--plugin nonexistent_module: cannot import"), error


def test_a_misspelled_config_key_is_answered_with_the_key_it_probably_meant(train_dir, capsys, monkeypatch):
    monkeypatch.chdir(train_dir)
    (train_dir / "train.yaml").write_text("stpes: 2\nrollout:\n  concurency: 4\n")
    assert main(["train", "agent.py:agent", "--tasks", "tasks.jsonl", "--config", "train.yaml"]) == 2
    assert _one_line_error(capsys.readouterr().err) == (
        "train.yaml: rollout.concurency: not a config key (did you mean rollout.concurrency?); "
        "stpes: not a config key (did you mean steps?)"
    )


def test_a_program_that_runs_in_its_own_directory_writes_to_agl_runs_store(workdir, tmp_path_factory, capfd):
    """``agl run`` hands its child an absolute ``AGL_STORE_URL``: a program that changes to its
    own directory still writes its reward to the store ``agl run`` (and the gateway) use."""
    elsewhere = tmp_path_factory.mktemp("their-agent")
    child = f"import os, agl; os.chdir({str(elsewhere)!r}); print(os.environ['AGL_STORE_URL']); agl.emit_reward(0.75)"
    assert main(["run", "--", sys.executable, "-c", child]) == 0
    assert capfd.readouterr().out.splitlines()[-1] == sqlite_url(workdir / ".agl" / "agl.db")
    store = SqliteStore(workdir / ".agl" / "agl.db")
    try:
        [rollout] = store.query_rollouts()
        assert [r.value for r in store.query_rewards(rollout_id=rollout.rollout_id)] == [0.75]
    finally:
        store.close()
    assert not (elsewhere / ".agl").exists()
