"""The capture API: the current rollout, rewards, spans and the buffered writer."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import agl
from agl.capture import (
    BufferedWriter,
    ErrorGuard,
    RolloutContext,
    annotate,
    capture_context,
    current_rollout,
    current_span_id,
    emit_reward,
    env_flag,
    error_guard,
    guarded,
    span,
    use_rollout,
)
from agl.capture import context as capture_module
from agl.errors import StoreUnavailable
from agl.schema import Reward, Span
from agl.store.sqlite import SqliteStore
from tests.conftest import wait_until


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "agl.db")
    yield s
    s.close()


@pytest.fixture
def writer(store):
    w = BufferedWriter(store, interval_s=0.05)
    yield w
    w.close()


@pytest.fixture
def production_store(tmp_path, monkeypatch):
    """Production observations (outside any rollout) go to a store of this test's own."""
    path = tmp_path / "production.db"
    monkeypatch.setenv("AGL_STORE_URL", f"sqlite:///{path}")
    monkeypatch.setattr(capture_module, "_production_writer", None)
    monkeypatch.setattr(capture_module, "_production", None)
    yield path
    if capture_module._production_writer is not None:
        capture_module._production_writer.close()
        capture_module._production_writer.store.close()


# -- the current rollout ---------------------------------------------------------


async def test_each_asyncio_task_sees_its_own_rollout():
    seen: dict[str, list[str | None]] = {}

    async def child(name):
        await asyncio.sleep(0.01)
        seen.setdefault(name, []).append(current_rollout().rollout_id)

    async def run(rollout_id):
        with use_rollout(RolloutContext(rollout_id=rollout_id)):
            await asyncio.sleep(0.01)
            await asyncio.gather(child(rollout_id), child(rollout_id), asyncio.create_task(child(rollout_id)))
            seen.setdefault(rollout_id, []).append(current_rollout().rollout_id)

    await asyncio.gather(run("ro-a"), run("ro-b"))
    assert seen == {"ro-a": ["ro-a"] * 4, "ro-b": ["ro-b"] * 4}
    assert current_rollout() is None


def test_threads_started_with_a_copied_context_see_their_rollout():
    results: dict[str, str | None] = {}
    a, b = RolloutContext(rollout_id="ro-a"), RolloutContext(rollout_id="ro-b")

    def work(key):
        results[key] = current_rollout().rollout_id

    with use_rollout(a):
        thread_a = threading.Thread(target=contextvars.copy_context().run, args=(work, "a"))
        with use_rollout(b):  # two rollouts active: only the context tells them apart
            thread_b = threading.Thread(target=contextvars.copy_context().run, args=(work, "b"))
            thread_a.start()
            thread_b.start()
            thread_a.join()
            thread_b.join()
    assert results == {"a": "ro-a", "b": "ro-b"}


def _in_bare_thread(fn):
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join()
    return box[0]


def test_a_bare_thread_sees_the_only_active_rollout():
    ctx = RolloutContext(rollout_id="ro-only")
    assert _in_bare_thread(current_rollout) is None
    with use_rollout(ctx):
        assert _in_bare_thread(current_rollout) is ctx
    assert _in_bare_thread(current_rollout) is None


def test_a_bare_thread_sees_no_rollout_when_two_are_active(production_store):
    a, b = RolloutContext(rollout_id="ro-a"), RolloutContext(rollout_id="ro-b")
    with use_rollout(a):
        with use_rollout(b):
            assert _in_bare_thread(current_rollout) is None
            assert _in_bare_thread(capture_context).rollout_id is None  # production
        assert _in_bare_thread(current_rollout) is a  # one left


def test_one_context_used_by_two_blocks_stays_active_until_both_end():
    ctx = RolloutContext(rollout_id="ro-shared")
    inner_done = threading.Event()
    outer_may_end = threading.Event()
    seen = []

    def inner():
        with use_rollout(ctx):
            pass
        inner_done.set()
        outer_may_end.wait(5)

    with use_rollout(ctx):
        thread = threading.Thread(target=inner)
        thread.start()
        assert inner_done.wait(5)
        seen.append(_in_bare_thread(current_rollout))
        outer_may_end.set()
        thread.join()
    assert seen == [ctx]
    assert _in_bare_thread(current_rollout) is None


# -- rewards, spans, annotations -------------------------------------------------


@pytest.mark.parametrize("bad", ["1.0", None, True, [1.0], {"v": 1}, b"1"])
def test_emit_reward_rejects_non_numbers_naming_value(bad, writer):
    with (
        use_rollout(RolloutContext(rollout_id="ro", writer=writer)),
        pytest.raises(ValueError, match=r"^value: .*real"),
    ):
        emit_reward(bad)
    assert writer.pending() == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_emit_reward_rejects_non_finite_values(bad, writer):
    with (
        use_rollout(RolloutContext(rollout_id="ro", writer=writer)),
        pytest.raises(ValueError, match=r"^value: .*finite"),
    ):
        emit_reward(bad)


def test_emit_reward_rejects_a_bad_name(writer):
    with use_rollout(RolloutContext(rollout_id="ro", writer=writer)):
        with pytest.raises(ValueError, match=r"^name: "):
            emit_reward(1.0, name="")
        with pytest.raises(ValueError, match=r"^name: "):
            emit_reward(1.0, name=3)


def test_rewards_and_spans_nest_and_reach_the_store(store, writer):
    ctx = RolloutContext(rollout_id="ro-1", writer=writer)
    with use_rollout(ctx):
        first = emit_reward(1, name="format")
        assert first.value == 1.0 and isinstance(first.value, float)
        with span("plan", kind="agent", goal="x") as outer:
            assert current_span_id() == outer.span_id
            with span("search", kind="tool") as inner:
                inner.attributes["hits"] = 3
                reward = emit_reward(0.5)
            note = annotate(step="after-search")
        assert current_span_id() is None
    writer.flush()
    spans = {s.name: s for s in store.query_spans(rollout_id="ro-1")}
    assert spans.keys() == {"plan", "search", "annotation"}
    assert spans["plan"].parent_id is None
    assert spans["search"].parent_id == outer.span_id
    assert spans["annotation"].parent_id == outer.span_id
    assert spans["annotation"].attributes == {"step": "after-search"} and note.kind == "custom"
    assert spans["search"].attributes == {"hits": 3} and spans["plan"].attributes == {"goal": "x"}
    assert spans["plan"].kind == "agent" and spans["search"].kind == "tool"
    assert all(s.status == "ok" and s.trace_id == ctx.trace_id and s.end_time >= s.start_time for s in spans.values())
    rewards = list(store.query_rewards(rollout_id="ro-1"))
    assert [(r.name, r.value, r.span_id) for r in rewards] == [("format", 1.0, None), ("reward", 0.5, inner.span_id)]
    assert rewards[1] == reward
    seqs = [first.seq, reward.seq, spans["search"].seq, spans["annotation"].seq, spans["plan"].seq]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


def test_a_span_records_the_error_and_lets_it_through(store, writer):
    with (
        use_rollout(RolloutContext(rollout_id="ro-err", writer=writer)),
        pytest.raises(KeyError),
        span("lookup", kind="tool"),
    ):
        raise KeyError("missing")
    writer.flush()
    [recorded] = store.query_spans(rollout_id="ro-err")
    assert recorded.status == "error" and recorded.attributes["error.type"] == "KeyError"


def test_outside_a_rollout_observations_are_production(production_store):
    reward = agl.emit_reward(0.25, name="thumbs-up")
    assert reward.rollout_id is None
    capture_module.production_writer().flush()
    with SqliteStore(production_store) as store:
        assert [(r.name, r.value) for r in store.query_rewards(production=True)] == [("thumbs-up", 0.25)]


# -- the buffered writer ---------------------------------------------------------


class FlakyStore(SqliteStore):
    """A real SQLite store whose next ``failures`` span writes fail as if it were down."""

    def __init__(self, *args, failures=0, delay_s=0.0, refuse=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.failures = failures
        self.delay_s = delay_s
        self.refuse = set(refuse)
        self.calls = 0

    def add_spans(self, spans):
        spans = list(spans)
        self.calls += 1
        time.sleep(self.delay_s)
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailable("the store is down (simulated)")
        refused = [s.span_id for s in spans if s.span_id in self.refuse]
        if refused:
            raise ValueError(f"span_id: {refused[0]} refused (simulated bad input)")
        super().add_spans(spans)


def _spans(n, prefix="s"):
    return [Span(span_id=f"{prefix}{i}", rollout_id="ro", name="s", seq=i) for i in range(n)]


def _stored(store) -> int:
    return store.stats().spans


def test_writer_flushes_by_size(store):
    w = BufferedWriter(store, batch_size=10, interval_s=60)
    try:
        for s in _spans(9):
            w.put(s)
        time.sleep(0.3)
        assert _stored(store) == 0  # under the batch size and long before the interval
        w.put(_spans(1, "x")[0])
        wait_until(lambda: _stored(store) == 10, "the 10 spans are stored")
    finally:
        w.close()


def test_writer_flushes_by_interval(store):
    w = BufferedWriter(store, batch_size=1000, interval_s=0.1)
    try:
        w.put(_spans(1)[0])
        wait_until(lambda: _stored(store) == 1, "the span is stored")
        assert w.pending() == 0 and w.written == 1
    finally:
        w.close()


def test_writer_flushes_on_demand_and_on_close(store):
    w = BufferedWriter(store, batch_size=1000, interval_s=60)
    for s in _spans(5):
        w.put(s)
    w.flush()
    assert _stored(store) == 5
    for s in _spans(3, "late"):
        w.put(s)
    w.close()
    assert _stored(store) == 8
    with pytest.raises(RuntimeError, match="closed"):
        w.put(_spans(1, "after")[0])


_EXITING = textwrap.dedent(
    """
    import sys
    import agl
    from agl.store.sqlite import SqliteStore

    store = SqliteStore(sys.argv[1])
    writer = agl.BufferedWriter(store, batch_size=100_000, interval_s=3600)
    with agl.use_rollout(agl.RolloutContext(rollout_id="ro-exit", writer=writer)):
        for i in range(500):
            with agl.span(f"step-{i}"):
                agl.emit_reward(i / 500)
    print(writer.pending(), flush=True)
    # no flush, no close: interpreter exit must write it all
    """
)


def test_writer_loses_nothing_at_interpreter_exit(tmp_path):
    path = tmp_path / "agl.db"
    proc = subprocess.run(
        [sys.executable, "-c", _EXITING, str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1000"  # all still buffered when the script ended
    with SqliteStore(path) as store:
        assert len(list(store.query_spans(rollout_id="ro-exit"))) == 500
        assert len(list(store.query_rewards(rollout_id="ro-exit"))) == 500


def test_writer_retries_a_store_that_fails_transiently(tmp_path):
    store = FlakyStore(tmp_path / "agl.db", failures=3)
    w = BufferedWriter(store, batch_size=4, interval_s=0.02)
    try:
        for s in _spans(10):
            w.put(s)
        w.flush(timeout_s=10)
        assert [s.seq for s in store.query_spans(rollout_id="ro")] == list(range(10))
        assert w.write_errors == 3 and isinstance(w.last_error, StoreUnavailable) and not w.rejected
    finally:
        w.close()
        store.close()


def test_flush_gives_up_after_its_timeout_and_keeps_the_items(tmp_path):
    store = FlakyStore(tmp_path / "agl.db", failures=10**9)
    w = BufferedWriter(store, interval_s=60)
    try:
        for s in _spans(3):
            w.put(s)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="3 observations still buffered"):
            w.flush(timeout_s=0.3)
        assert time.monotonic() - started < 2
        assert w.pending() == 3
        store.failures = 0  # the store comes back
        w.flush(timeout_s=5)
        assert _stored(store) == 3
    finally:
        w.close()
        store.close()


def test_one_bad_item_does_not_hold_back_the_rest(tmp_path):
    store = FlakyStore(tmp_path / "agl.db", refuse={"s2"})
    w = BufferedWriter(store, batch_size=100, interval_s=60)
    try:
        for s in _spans(5):
            w.put(s)
        w.flush(timeout_s=5)
        stored = list(store.query_spans(rollout_id="ro"))
        assert sorted(s.span_id for s in stored if s.name != "agl.dropped") == ["s0", "s1", "s3", "s4"]
        [marker] = [s for s in stored if s.name == "agl.dropped"]  # the rollout's record of the loss
        assert marker.attributes["agl.dropped.span"] == 1 and w.dropped == {"span": 1}
        [(item, error)] = w.rejected
        assert item.span_id == "s2" and "span_id" in str(error)
        assert w.pending() == 0
    finally:
        w.close()
        store.close()


def test_put_never_waits_for_a_slow_store(tmp_path):
    store = FlakyStore(tmp_path / "agl.db", delay_s=0.3)
    w = BufferedWriter(store, batch_size=1000, interval_s=0.01)
    durations = []
    items = (Span(span_id=f"s{i}", rollout_id="ro", name="s", seq=i) for i in itertools.count())

    def put_100() -> bool:
        for _ in range(100):
            item = next(items)
            t0 = time.perf_counter()
            w.put(item)
            durations.append(time.perf_counter() - t0)
        return len(durations) >= 3000 and store.calls >= 2

    try:
        # rounds of puts every 0.02 s, while the store spends 0.3 s on every write
        wait_until(put_100, "3000 puts are made and the store has been written twice meanwhile", step_s=0.02)
        assert statistics.median(durations) < 50e-6, f"median put {statistics.median(durations) * 1e6:.1f} µs"
        assert max(durations) < store.delay_s / 2, f"a put waited {max(durations):.3f}s, like a store write"
        w.flush(timeout_s=30)
        assert _stored(store) == len(durations)
    finally:
        w.close()
        store.close()


def test_writer_validates_its_options(store):
    with pytest.raises(ValueError, match="batch_size"):
        BufferedWriter(store, batch_size=0)
    with pytest.raises(ValueError, match="interval_s"):
        BufferedWriter(store, interval_s=0)
    with pytest.raises(ValueError, match="max_buffered"):
        BufferedWriter(store, batch_size=10, max_buffered=5)


def test_a_full_buffer_pushes_back_instead_of_growing(tmp_path):
    store = FlakyStore(tmp_path / "agl.db", delay_s=0.05)
    w = BufferedWriter(store, batch_size=10, interval_s=0.01, max_buffered=20)
    try:
        for s in _spans(200):
            w.put(s)
            assert w.pending() <= 20 + 1
        w.flush(timeout_s=30)
        assert _stored(store) == 200
    finally:
        w.close()
        store.close()


def test_rewards_and_llm_calls_go_through_the_writer(store, writer):
    from agl.schema import LLMCall

    writer.put(LLMCall(call_id="c1", rollout_id="ro", prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.1]))
    writer.put(Reward(rollout_id="ro", value=1.0))
    writer.flush()
    assert [c.call_id for c in store.query_llm_calls(rollout_id="ro")] == ["c1"]
    assert [r.value for r in store.query_rewards(rollout_id="ro")] == [1.0]


# -- what the integrations share: the env flag and the error guard ----------------------------


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " Yes ", "on", "On"])
def test_env_flag_on(monkeypatch, value):
    monkeypatch.setenv("AGL_TEST_INSTRUMENT", value)
    assert env_flag("AGL_TEST_INSTRUMENT") is True


@pytest.mark.parametrize("value", ["0", "false", "False", " no", "OFF", "", "  "])
def test_env_flag_off(monkeypatch, value):
    monkeypatch.setenv("AGL_TEST_INSTRUMENT", value)
    assert env_flag("AGL_TEST_INSTRUMENT", default=True) is False


def test_env_flag_unset_is_the_default(monkeypatch):
    monkeypatch.delenv("AGL_TEST_INSTRUMENT", raising=False)
    assert env_flag("AGL_TEST_INSTRUMENT") is False
    assert env_flag("AGL_TEST_INSTRUMENT", default=True) is True


@pytest.mark.parametrize("value", ["2", "enabled", "y", "tru"])
def test_env_flag_refuses_anything_else_and_says_why(monkeypatch, value):
    monkeypatch.setenv("AGL_TEST_INSTRUMENT", value)
    with pytest.raises(ValueError, match=rf"AGL_TEST_INSTRUMENT='{value}': use 1, true, yes or on"):
        env_flag("AGL_TEST_INSTRUMENT")


def test_guard_env_flag_reports_a_refused_value_once_and_reads_it_as_off(monkeypatch, caplog):
    guard = ErrorGuard("agl_test_env")
    monkeypatch.setenv("AGL_TEST_INSTRUMENT", "maybe")
    with caplog.at_level(logging.WARNING, logger="agl_test_env"):
        assert guard.env_flag("AGL_TEST_INSTRUMENT") is False
        assert guard.env_flag("AGL_TEST_INSTRUMENT") is False
    assert guard.errors["AGL_TEST_INSTRUMENT"] == 2
    assert [r.getMessage().count("'maybe'") for r in caplog.records] == [1]
    monkeypatch.setenv("AGL_TEST_INSTRUMENT", "on")
    assert guard.env_flag("AGL_TEST_INSTRUMENT") is True


def test_error_guard_is_one_per_name():
    assert error_guard("agl_test_shared") is error_guard("agl_test_shared")
    assert error_guard("agl_test_shared") is not error_guard("agl_test_other")


class _Watcher:
    def __init__(self):
        self.error_guard = ErrorGuard("agl_test_guarded")
        self.seen = []

    @guarded
    def on_event(self, value):
        self.seen.append(value)
        if value < 0:
            raise RuntimeError(f"bad value {value}")
        return value


def test_guarded_methods_report_exceptions_and_return_none(caplog):
    watcher = _Watcher()
    with caplog.at_level(logging.DEBUG, logger="agl_test_guarded"):
        assert watcher.on_event(1) is None
        assert watcher.on_event(-1) is None
        assert watcher.on_event(-2) is None
    assert watcher.seen == [1, -1, -2]
    assert watcher.error_guard.errors == {"on_event": 2} and watcher.error_guard.total == 2
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "on_event failed" in warnings[0].getMessage()
    assert isinstance(warnings[0].exc_info[1], RuntimeError)  # the traceback is logged
    assert _Watcher.on_event.__name__ == "on_event"


def test_guarded_methods_let_interrupts_through():
    class Interrupted(_Watcher):
        @guarded
        def on_event(self, value):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Interrupted().on_event(1)
