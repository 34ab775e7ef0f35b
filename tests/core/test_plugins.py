"""The plugin registry through pluggy: call order, wrappers, failure isolation, lazy views,
refused hooks, AGL_LOAD_PLUGINS, and the store schemes and commands plugins add.

Real parts only: a real SQLite store, the process's real plugin manager, a real
subprocess for the environment variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agl.errors import ConfigError
from agl.hookspecs import hookimpl
from agl.plugins import (
    RewardAnswer,
    get_plugin_manager,
    list_plugins,
    register,
    resolve,
    reward_answers,
    unregister,
)
from agl.schema import LLMCall, Rollout, RolloutStatus, Span, Task
from agl.store.base import open_store
from agl.store.sqlite import SqliteStore
from agl_trainer.transitions import build_transitions


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Names to unregister after the test (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        unregister(name=name)


def _plug(names: list[str], plugin: object, name: str) -> None:
    register(plugin, name=name)
    names.append(name)


def _ended_rollout(store, rid: str = "ro-1", output: str = "42"):
    store.add_tasks([Task(task_id="t-1", input={"answer": "42"})])
    store.enqueue([Rollout(rollout_id=rid, task_id="t-1")])
    store.claim("runner", limit=10)
    store.add_llm_calls(
        [LLMCall(call_id=f"{rid}-c0", rollout_id=rid, seq=0, prompt_ids=[1, 2], response_ids=[3], created_at=10.0)]
    )
    store.add_spans(
        [
            Span(
                span_id=f"{rid}-s0",
                rollout_id=rid,
                name="chat",
                kind="llm",
                start_time=9.9,
                end_time=10.0,
                attributes={"gen_ai.response.id": f"{rid}-c0"},
            )
        ]
    )
    return store.finish(rid, RolloutStatus.SUCCEEDED, output=output)


def _stored(store, rid: str = "ro-1") -> dict[tuple[str, str], float]:
    return {(w.source, w.name): w.value for w in store.query_rewards(rollout_id=rid)}


class Zero:
    @staticmethod
    @hookimpl
    def agl_reward(rollout):
        return 0.0


class One:
    @staticmethod
    @hookimpl(tryfirst=True)
    def agl_reward(rollout):
        return 1.0


# -- the reward hook through the relay ---------------------------------------------------


def test_a_tryfirst_plugin_gives_the_final_reward(sqlite_store, registered):
    r = _ended_rollout(sqlite_store)
    # Registered first and pluggy calls the last registered first: only tryfirst puts "one" ahead of "zero".
    _plug(registered, One, "one")
    _plug(registered, Zero, "zero")
    (t,), report = build_transitions(sqlite_store, [r])
    assert t.reward == 1.0 and report.plugin_errors == 0
    assert _stored(sqlite_store) == {("one", "reward"): 1.0, ("zero", "reward"): 0.0}


def test_without_tryfirst_the_plugin_called_first_wins(sqlite_store, registered):
    class Half:
        @staticmethod
        @hookimpl
        def agl_reward(rollout):
            return 0.5

    r = _ended_rollout(sqlite_store)
    _plug(registered, Half, "half")
    _plug(registered, Zero, "zero")  # registered last: called first
    (t,), _ = build_transitions(sqlite_store, [r])
    assert t.reward == 0.0


def test_a_wrapper_sees_every_answer_and_can_change_them(sqlite_store, registered):
    seen: list[RewardAnswer] = []

    class Doubler:
        @staticmethod
        @hookimpl(wrapper=True)
        def agl_reward(rollout):
            answers = yield
            seen.extend(answers)
            return [a._replace(value=a.value * 2) if a.plugin == "one" else a for a in answers]

    r = _ended_rollout(sqlite_store)
    _plug(registered, Zero, "zero")
    _plug(registered, One, "one")
    _plug(registered, Doubler, "doubler")
    (t,), _ = build_transitions(sqlite_store, [r])
    assert seen == [RewardAnswer("one", 1.0), RewardAnswer("zero", 0.0)]  # call order: tryfirst first
    assert t.reward == 2.0
    assert _stored(sqlite_store) == {("one", "reward"): 2.0, ("zero", "reward"): 0.0}


def test_a_failing_plugin_loses_only_its_own_answer(sqlite_store, registered, caplog):
    class Broken:
        @staticmethod
        @hookimpl(tryfirst=True)
        def agl_reward(rollout):
            raise RuntimeError("judge unreachable")

    class NotANumber:
        @staticmethod
        @hookimpl
        def agl_reward(rollout):
            return {"reward": 1.0, "style": "great"}

    r = _ended_rollout(sqlite_store)
    _plug(registered, Broken, "broken")
    _plug(registered, NotANumber, "nan")
    (t,), report = build_transitions(sqlite_store, [r])
    assert t.reward == 1.0 and report.plugin_errors == 2
    assert _stored(sqlite_store) == {("nan", "reward"): 1.0}
    assert "reward plugin broken failed on rollout ro-1: RuntimeError: judge unreachable" in caplog.text
    assert "reward plugin nan: reward 'style' of rollout ro-1 is not a number" in caplog.text


def test_an_instance_plugin_gets_the_arguments_it_names_and_pluggy_keeps_its_function(sqlite_store, registered):
    """A plugin object's method, naming the hook's arguments in an order of its own, is answered for without
    pluggy's record of it being changed; the relay itself stays pluggy's plain call."""

    class Judge:
        def __init__(self):
            self.seen = []

        @hookimpl(tryfirst=True)
        def agl_reward(self, rewards, rollout):
            self.seen.append((rollout.rollout_id, list(rewards)))
            return {"reward": 0.25, "judged": 1.0}

    judge = Judge()
    r = _ended_rollout(sqlite_store)
    _plug(registered, judge, "judge")
    _plug(registered, Zero, "zero")
    (t,), report = build_transitions(sqlite_store, [r])
    assert t.reward == 0.25 and report.plugin_errors == 0 and judge.seen == [("ro-1", [])]
    assert _stored(sqlite_store) == {("judge", "reward"): 0.25, ("judge", "judged"): 1.0, ("zero", "reward"): 0.0}
    impls = {i.plugin_name: i for i in get_plugin_manager().hook.agl_reward.get_hookimpls()}
    assert impls["judge"].function == judge.agl_reward and impls["zero"].function is Zero.agl_reward
    assert reward_answers(rollout=r, spans=[], llm_calls=[], rewards=[])[:2] == [
        RewardAnswer("judge", {"reward": 0.25, "judged": 1.0}),
        RewardAnswer("zero", 0.0),
    ]
    plain = get_plugin_manager().hook.agl_reward(rollout=r, spans=[], llm_calls=[], rewards=[])
    assert plain[:2] == [{"reward": 0.25, "judged": 1.0}, 0.0]


def test_implementations_named_apart_with_specname_answer_once_under_their_plugin(sqlite_store, registered):
    calls = []

    class Named:
        @staticmethod
        @hookimpl(specname="agl_reward")
        def judge(rollout):
            calls.append(rollout.rollout_id)
            return 0.5

        @staticmethod
        @hookimpl(specname="agl_register_loggers")
        def loggers(register):
            register("test-named", dict)

    r = _ended_rollout(sqlite_store)
    _plug(registered, Named, "named")
    _plug(registered, Zero, "zero")
    (t,), _ = build_transitions(sqlite_store, [r])
    assert calls == ["ro-1"] and t.reward == 0.0  # zero, registered last, is called first
    assert _stored(sqlite_store) == {("named", "reward"): 0.5, ("zero", "reward"): 0.0}
    (row,) = [p for p in list_plugins() if p["name"] == "named"]
    assert row["provides"] == {"loggers": ["test-named"]}
    assert resolve("logger", "test-named") is dict


class CountingStore(SqliteStore):
    """A real SQLite store that counts the per-rollout queries reward plugins cause."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.queries: list[str] = []

    def query_spans(self, **kw):
        if "rollout_id" in kw:
            self.queries.append("spans")
        return super().query_spans(**kw)

    def query_llm_calls(self, **kw):
        if "rollout_id" in kw:
            self.queries.append("llm_calls")
        return super().query_llm_calls(**kw)

    def query_rewards(self, **kw):
        if "rollout_id" in kw:
            self.queries.append("rewards")
        return super().query_rewards(**kw)


def test_records_are_read_only_by_a_plugin_that_reads_them(tmp_path, registered):
    store = CountingStore(tmp_path / "agl.db")
    try:
        r = _ended_rollout(store)
        _plug(registered, Zero, "zero")
        build_transitions(store, [r])
        assert store.queries == []  # a plugin taking only the rollout costs no query

        got = {}

        class Reader:
            @staticmethod
            @hookimpl
            def agl_reward(rollout, spans, llm_calls):
                got["calls"] = [c.call_id for c in llm_calls]
                got["n"], got["first"], got["again"] = len(llm_calls), llm_calls[0].call_id, list(llm_calls)
                got["spans_unread"] = spans
                return None

        _plug(registered, Reader, "reader")
        build_transitions(store, [r])
        assert store.queries == ["llm_calls"]  # read four ways, queried once; spans never read
        assert got["calls"] == ["ro-1-c0"] and got["n"] == 1 and got["first"] == "ro-1-c0"
        assert [c.call_id for c in got["again"]] == ["ro-1-c0"]
        assert "not loaded" in repr(got["spans_unread"])
    finally:
        store.close()


# -- registration ------------------------------------------------------------------------


def test_a_misspelled_hook_is_refused_naming_plugin_and_hook():
    class Typo:
        @staticmethod
        @hookimpl
        def agl_rewards(rollout):
            return 1.0

    with pytest.raises(ConfigError, match=r"plugin 'typo': unknown hook 'agl_rewards' \(did you mean 'agl_reward'\?\)"):
        register(Typo, name="typo")
    register(Zero, name="typo")  # the refused plugin left nothing behind: its name is free
    unregister(name="typo")


def test_an_unmarked_agl_function_is_a_hook_too():
    class Unmarked:
        @staticmethod
        def agl_step_end(step, metrics):
            pass

    with pytest.raises(ConfigError, match=r"unknown hook 'agl_step_end' \(did you mean 'agl_step_ended'\?\)"):
        register(Unmarked, name="unmarked")


def test_an_argument_the_hook_does_not_have_is_refused():
    class Extra:
        @staticmethod
        @hookimpl
        def agl_reward(rollout, judge):
            return 1.0

    refused = r"plugin 'extra', hook 'agl_reward': .*Argument\(s\) \{'judge'\} are declared in the hookimpl but"
    with pytest.raises(ConfigError, match=refused):
        register(Extra, name="extra")


def test_an_async_hook_is_refused():
    class Async:
        @staticmethod
        @hookimpl
        async def agl_reward(rollout):
            return 1.0

    with pytest.raises(ConfigError, match="plugin 'async': hook agl_reward is async"):
        register(Async, name="async")


def _loaded_plugins(env_value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGL_LOAD_PLUGINS"}
    if env_value is not None:
        env["AGL_LOAD_PLUGINS"] = env_value
    code = "import json, agl_trainer, agl.plugins as p; print(json.dumps(sorted(r['name'] for r in p.list_plugins())))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_plugin_that_imports_agl_trainer_while_the_registry_loads_adds_its_built_ins():
    # agl_verl's command registration imports agl_trainer, which adds built-ins while the
    # registry is being made (this deadlocked once): they are registered all the same.
    code = "import json, agl.plugins as p; print(json.dumps(sorted(r['name'] for r in p.list_plugins())))"
    env = {k: v for k, v in os.environ.items() if k != "AGL_LOAD_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = json.loads(out.stdout)
    assert "verl" in names and "agl_trainer.credit" in names and "agl_trainer.loggers" in names, names


def test_agl_load_plugins_limits_the_installed_plugins_loaded():
    from importlib.metadata import entry_points

    installed = sorted(ep.name for ep in entry_points(group="agl"))
    assert len(installed) >= 2, installed  # the workspace installs agl-verl and agl-otel
    everything = _loaded_plugins(None)
    builtins = ["agl.store.schemes", "agl_trainer.credit", "agl_trainer.loggers"]
    assert json.loads(everything.stdout) == sorted([*builtins, *installed]), everything.stderr
    assert json.loads(_loaded_plugins("").stdout) == builtins
    one = installed[0]
    assert json.loads(_loaded_plugins(f" {one} ,").stdout) == sorted([*builtins, one])
    missing = _loaded_plugins(f"{one},no-such-plugin")
    assert missing.returncode != 0
    assert "AGL_LOAD_PLUGINS: no installed plugin named 'no-such-plugin'" in missing.stderr


# -- store schemes and commands from plugins ----------------------------------------------


def test_a_plugin_adds_a_store_scheme(tmp_path, registered):
    class MemTest:
        @staticmethod
        @hookimpl
        def agl_register_store_schemes(register):
            def opener(url, **options):
                return SqliteStore(tmp_path / (url.split("://", 1)[1] + ".db"), **options)

            register("memtest", opener)

    with pytest.raises(ConfigError, match=r"store url 'memtest://a': store scheme: no plugin provides 'memtest' \("):
        open_store("memtest://a")
    _plug(registered, MemTest, "memtest")
    with open_store("memtest://a") as store:
        assert isinstance(store, SqliteStore)
        store.add_tasks([Task(task_id="t", input={})])
        assert store.get_task("t").task_id == "t"
    assert (tmp_path / "a.db").exists()
    with pytest.raises(ConfigError, match=r"no plugin provides 'nope' \(installed: http, https, memtest, postgres"):
        open_store("nope://x")


def test_a_plugin_cannot_replace_a_builtin_scheme(tmp_path, registered):
    class Hijack:
        @staticmethod
        @hookimpl
        def agl_register_store_schemes(register):
            register("sqlite", lambda url, **options: pytest.fail("a plugin replaced sqlite://"))

    with pytest.raises(ConfigError) as refused:
        _plug(registered, Hijack, "hijack")
    assert str(refused.value) == (
        "plugin 'hijack', hook 'agl_register_store_schemes': register(name='sqlite'): "
        "name: the store scheme 'sqlite' is agl's own (agl.store.schemes), not replaceable"
    )
    assert get_plugin_manager().get_plugin("hijack") is None  # refused, so left out
    with open_store(f"sqlite:///{tmp_path / 'x.db'}") as store:
        assert isinstance(store, SqliteStore)


def test_a_plugin_adds_a_command(registered, capsys):
    from agl_trainer.cli import main

    class Hello:
        @staticmethod
        @hookimpl
        def agl_register_commands(register):
            def configure(parser):
                parser.add_argument("--name", default="world")
                parser.set_defaults(func=lambda args: print(f"hello {args.name}") or 3)

            register("hello", configure, description="say hello")

    _plug(registered, Hello, "hello")
    assert main(["hello", "--name", "agl"]) == 3
    assert capsys.readouterr().out == "hello agl\n"


def test_a_command_clashing_with_a_builtin_one_is_a_clear_error(registered, capsys):
    from agl_trainer.cli import main

    class Clash:
        @staticmethod
        @hookimpl
        def agl_register_commands(register):
            register("plugins", lambda parser: None)

    _plug(registered, Clash, "clash")
    assert main(["plugins", "--json"]) == 2
    err = capsys.readouterr().err
    assert "plugin 'clash', hook 'agl_register_commands': command 'plugins' is one agl has already" in err
