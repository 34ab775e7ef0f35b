"""Store URLs: one default for every command and the trainer, SQLite URL forms, and opening without creating."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agl
from agl.errors import ConfigError
from agl.schema import Task
from agl.store import openers
from agl.store.base import DEFAULT_STORE_URL, default_store_url, open_store, sqlite_path
from agl.store.sqlite import SqliteStore

FORMS = "sqlite:///relative/path.db or sqlite:////absolute/path.db"


def test_the_default_is_the_variable_else_agl_db_in_the_working_directory(monkeypatch):
    monkeypatch.delenv("AGL_STORE_URL", raising=False)
    assert default_store_url() == DEFAULT_STORE_URL == "sqlite:///.agl/agl.db"
    monkeypatch.setenv("AGL_STORE_URL", "http://127.0.0.1:4317")
    assert default_store_url() == "http://127.0.0.1:4317"


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:/x.db", "sqlite://x.db", "SQLITE:/x.db", "sqlite:////"])
def test_a_sqlite_url_without_a_path_or_with_too_few_slashes_names_the_forms(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        open_store(url)
    assert str(caught.value) == f"store url {url!r}: a sqlite url is {FORMS}"
    assert list(tmp_path.iterdir()) == []  # nothing was created on the way


def test_sqlite_paths_relative_absolute_and_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert str(sqlite_path("sqlite:///runs/agl.db")) == "runs/agl.db"
    assert str(sqlite_path("sqlite:////abs/agl.db")) == "/abs/agl.db"
    assert sqlite_path("sqlite:///~/runs/agl.db") == tmp_path / "runs" / "agl.db"
    assert sqlite_path("~/plain.db") == tmp_path / "plain.db"


def test_tilde_is_expanded_when_opening(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///~/stores/agl.db") as store:
        store.add_tasks([Task(task_id="t", input={})])
    assert (tmp_path / "stores" / "agl.db").is_file() and not (tmp_path / "~").exists()


@pytest.mark.parametrize("url", ["sqlite:///nope/none.db", "nope/none.db"])
def test_a_reader_refuses_a_store_that_does_not_exist_and_creates_nothing(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^no such store: nope/none\.db \("):
        open_store(url, create=False)
    assert not (tmp_path / "nope").exists()


def test_a_reader_without_a_url_refuses_a_missing_default_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGL_STORE_URL", raising=False)
    with pytest.raises(ConfigError, match=r"no such store: \.agl/agl\.db"):
        open_store(create=False)
    assert not (tmp_path / ".agl").exists()


def test_a_reader_opens_a_store_that_exists_and_a_writer_creates_one(tmp_path):
    url = f"sqlite:///{tmp_path / 'new' / 'agl.db'}"
    with open_store(url) as store:  # create=True: a writer makes the directory and the file
        assert isinstance(store, SqliteStore)
        store.add_tasks([Task(task_id="t", input={"q": 1})])
    with open_store(url, create=False) as store:
        assert store.get_task("t").input == {"q": 1}


def _outcome(opener, url, **options):
    try:
        store = opener(url, **options)
    except ConfigError as exc:
        return f"ConfigError: {exc}"
    store.close()
    return f"{type(store).__name__} at {sqlite_path(url) if '://' not in url or url.startswith('sqlite') else url}"


def test_agl_open_store_opens_the_core_schemes_as_the_plugin_lookup_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert agl.open_store is openers.open_store
    cases = [
        ("sqlite:///a.db", {}),
        ("b.db", {}),
        (f"sqlite:///{tmp_path}/missing.db", {"create": False}),
        ("sqlite://x.db", {}),
        ("nope://somewhere", {}),
    ]
    for url, options in cases:
        assert _outcome(openers.open_store, url, **options) == _outcome(open_store, url, **options), url


def test_opening_a_sqlite_store_loads_neither_the_plugin_registry_nor_pluggy(tmp_path):
    code = (
        "import sys, agl\n"
        f"agl.open_store({str(tmp_path / 'agl.db')!r}).close()\n"
        "print(sorted(m for m in ('pluggy', 'agl.plugins', 'agl.hookspecs') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
