"""Provider hooks, one shape for every kind: ``agl_register_<kind>s(register)`` then ``resolve``.

The process's real plugin registry; ``agl plugins`` as a real subprocess of the ``agl``
command's ``main``, with the plugins this workspace installs (agl-verl, agl-otel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import agl_trainer  # noqa: F401  (its built-in credit strategies and loggers)
from agl.errors import ConfigError
from agl.hookspecs import hookimpl
from agl.plugins import get_plugin_manager, list_plugins, register, resolve, unregister
from agl.providers import KINDS


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Names to unregister after the test (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        if get_plugin_manager().get_plugin(name) is not None:
            unregister(name=name)


def _provider(kind: str, provides: dict, **impl_options):
    """A plugin whose ``agl_register_<kind>s`` registers ``provides`` (``{name: factory}``)."""

    def provide(register):
        for name, factory in provides.items():
            register(name, factory, description=f"test {kind}")

    provide.__name__ = KINDS[kind].hook
    return type("Provider", (), {KINDS[kind].hook: staticmethod(hookimpl(**impl_options)(provide))})


def _made(**config):
    return ("made", config)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_registers_and_resolves_the_same_way(kind, registered):
    name = "test-x"
    with pytest.raises(ConfigError, match=rf"no plugin provides '{name}' \(.*installed: .*see agl plugins\)"):
        resolve(kind, name)
    register(_provider(kind, {name: _made}), name=f"test-{kind}")
    registered.append(f"test-{kind}")
    if KINDS[kind].builds:
        assert resolve(kind, name, {"size": 3}) == ("made", {"size": 3})  # the factory, called with the config
    else:
        assert resolve(kind, name) is _made  # what was registered, as it is
    (row,) = [r for r in list_plugins() if r["name"] == f"test-{kind}"]
    assert row["provides"] == {f"{kind}s": [name]}
    assert row["hooks"] == [KINDS[kind].hook]
    assert row["distribution"] == "(registered in code)"


def test_a_misspelt_name_suggests_the_closest_one_of_its_kind():
    with pytest.raises(ConfigError, match=r"logger: no plugin provides 'wandbb' \(did you mean 'wandb'\? installed"):
        resolve("logger", "wandbb")
    with pytest.raises(ConfigError, match=r"store scheme: no plugin provides 'sqlit' \(did you mean 'sqlite'\?"):
        resolve("store_scheme", "sqlit")


def test_the_first_in_call_order_wins_a_name_and_agl_plugins_says_so(registered):
    register(_provider("backend", {"dup": lambda **c: "early"}, tryfirst=True), name="test-early")
    register(_provider("backend", {"dup": lambda **c: "late"}), name="test-late")
    registered += ["test-early", "test-late"]
    assert resolve("backend", "dup") == "early"
    rows = {r["name"]: r["provides"] for r in list_plugins()}
    assert rows["test-early"] == {"backends": ["dup"]}
    assert rows["test-late"] == {"backends": ["dup (overridden by 'test-early')"]}
    unregister(name="test-early")
    assert resolve("backend", "dup") == "late"


def test_a_wrapper_registers_under_its_own_plugin(registered):
    class Wrapping:
        @staticmethod
        @hookimpl(wrapper=True)
        def agl_register_engines(register):
            register("wrapped", _made)
            return (yield)

    register(Wrapping, name="test-wrapping")
    registered.append("test-wrapping")
    assert resolve("engine", "wrapped", {"a": 1}) == ("made", {"a": 1})
    (row,) = [r for r in list_plugins() if r["name"] == "test-wrapping"]
    assert row["provides"] == {"engines": ["wrapped"]}


@pytest.mark.parametrize(
    ("register_args", "field"),
    [
        (("", _made), r"register\(name=''\): name: expected a backend name matching"),
        (("two words", _made), r"register\(name='two words'\): name: expected a backend name"),
        ((7, _made), r"register\(name=7\): name: expected a backend name"),
        (("ok", "not callable"), r"register\(name='ok'\): factory: expected a callable, got str"),
        (("ok", _made, 3), r"register\(name='ok'\): description: expected a string, got int"),
    ],
)
def test_a_bad_registration_is_refused_naming_the_plugin_and_the_field(register_args, field, registered):
    class Bad:
        @staticmethod
        @hookimpl
        def agl_register_backends(register):
            register(*register_args)

    registered.append("test-bad")
    with pytest.raises(ConfigError, match=rf"^plugin 'test-bad', hook 'agl_register_backends': {field}"):
        register(Bad, name="test-bad")
    assert get_plugin_manager().get_plugin("test-bad") is None  # refused when registered, not at first use


def test_a_name_registered_twice_by_one_plugin_is_refused(registered):
    class Twice:
        @staticmethod
        @hookimpl
        def agl_register_loggers(register):
            register("twice", _made)
            register("twice", _made)

    registered.append("test-twice")
    with pytest.raises(ConfigError, match=r"'test-twice'.*register\(name='twice'\): name: registered twice"):
        register(Twice, name="test-twice")


def test_a_command_name_must_be_a_command_word(registered):
    class Upper:
        @staticmethod
        @hookimpl
        def agl_register_commands(register):
            register("Hello", lambda parser: None)

    registered.append("test-upper")
    with pytest.raises(ConfigError, match=r"register\(name='Hello'\): name: expected a command name matching"):
        register(Upper, name="test-upper")


def test_the_old_hook_shapes_are_refused_with_the_new_name():
    class Old:
        @staticmethod
        @hookimpl
        def agl_backend(name, config):
            return None

    with pytest.raises(ConfigError, match=r"unknown hook 'agl_backend' \(did you mean 'agl_register_backends'\?\)"):
        register(Old, name="test-old")

    class OldCommands:
        @staticmethod
        @hookimpl
        def agl_register_commands(subparsers):
            return None

    with pytest.raises(ConfigError, match=r"plugin 'test-old-commands', hook 'agl_register_commands': .*subparsers"):
        register(OldCommands, name="test-old-commands")


def _agl(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")} | {"COLUMNS": "250"}
    code = "import sys\nfrom agl_trainer.cli import main\nsys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


def test_agl_plugins_lists_what_each_plugin_provides():
    done = _agl("plugins", "--json")
    assert done.returncode == 0, done.stderr
    provides = {row["name"]: row["provides"] for row in json.loads(done.stdout)}
    assert provides["verl"] == {"backends": ["verl"], "engines": ["transformers", "vllm"], "commands": ["engine"]}
    assert provides["agl_trainer.credit"] == {"credit_assignments": ["broadcast", "last", "discounted", "emitted"]}
    assert provides["agl_trainer.loggers"] == {"loggers": ["tensorboard", "wandb"]}
    assert provides["agl.store.schemes"] == {"store_schemes": ["sqlite", "http", "https", "postgresql", "postgres"]}
    assert provides["otel"] == {}  # it serves routes (agl_store_routes) and provides no named component
    table = _agl("plugins")
    assert table.returncode == 0, table.stderr
    assert "backends: verl" in table.stdout and "engines: transformers, vllm" in table.stdout
    assert "commands: engine" in table.stdout


def test_a_backend_nobody_provides_names_the_package_to_install():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")} | {"AGL_LOAD_PLUGINS": ""}
    code = "import agl_trainer\nfrom agl.plugins import resolve\nresolve('backend', 'verl')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ConfigError: no backend 'verl': pip install agl-verl (it provides it; installed: none)" in done.stderr


def test_a_builtin_store_scheme_opens_without_loading_installed_plugins(tmp_path):
    """agl-core's schemes cannot be replaced, so open_store asks no plugin for them: an agent process that opens
    its store does not load (or depend on) what is installed. AGL_LOAD_PLUGINS names a plugin that does not exist,
    which would be an error the moment the registry loaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")} | {"AGL_LOAD_PLUGINS": "no-such-plugin"}
    code = (
        "import sys, agl.plugins as p\nfrom agl.store import open_store\n"
        "open_store(sys.argv[1]).close()\nprint(p._manager is None)\n"
        "open_store('nope://x')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'a.db'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == "True\n", done.stderr
    assert (tmp_path / "a.db").exists()
    # a scheme agl-core does not have is looked up among the plugins, so then the registry loads (and here refuses)
    assert "AGL_LOAD_PLUGINS: no installed plugin named 'no-such-plugin'" in done.stderr
