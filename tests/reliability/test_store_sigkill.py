"""Drill: SIGKILL the store server while clients write spans, LLM calls and rewards.

The server is the real ``agl store serve`` on a SQLite file; the writers are threads
using agl's HTTP store client (two clients, so both coalesced ``/v1/batch`` traffic
from several threads and a client of its own are in flight at the kill). Each write
has fixed ids and is retried with the same ids until acknowledged, as the runner and
the buffered writer do. After a restart on the same file and port, every write that
was acknowledged before the kill is there, and nothing is stored twice.
"""

from __future__ import annotations

import threading
import time

import pytest

from agl.credentials import new_token
from agl.errors import StoreUnavailable
from agl.schema import LLMCall, Reward, Span
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from tests.conftest import free_port, wait_until
from tests.reliability.conftest import StoreProcess

WRITERS = 6

pytestmark = pytest.mark.slow  # real subprocess servers, restarted: tens of seconds on a busy host


class Acked:
    """What the store acknowledged, by kind, and how often a write had to be sent again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[str] = []
        self.calls: list[str] = []
        self.rewards: list[str] = []
        self.resent = 0
        self.failures: list[BaseException] = []

    def total(self) -> int:
        with self.lock:
            return len(self.spans) + len(self.calls) + len(self.rewards)

    def snapshot(self) -> tuple[set[str], set[str], set[str]]:
        with self.lock:
            return set(self.spans), set(self.calls), set(self.rewards)


def _until_acked(acked: Acked, write, items: list) -> None:
    while True:
        try:
            write(items)
            return
        except StoreUnavailable:
            with acked.lock:
                acked.resent += 1
            time.sleep(0.05)  # the very same ids again: the store must not double them


def _writer(store: HttpStore, w: int, acked: Acked, stop: threading.Event) -> None:
    try:
        i = 0
        while not stop.is_set():
            rollout = f"ro-{w}-{i // 10}"
            spans = [Span(span_id=f"s-{w}-{i}-{k}", rollout_id=rollout, seq=2 * i + k, name="step") for k in range(2)]
            call = LLMCall(
                call_id=f"c-{w}-{i}",
                rollout_id=rollout,
                seq=i,
                prompt_ids=[1, 2, 3, i % 1000],
                response_ids=[4, 5],
                response_logprobs=[-0.5, -0.25],
            )
            reward = Reward(reward_id=f"r-{w}-{i}", rollout_id=rollout, value=(i % 7) / 7, seq=i)
            _until_acked(acked, store.add_spans, spans)
            with acked.lock:
                acked.spans.extend(s.span_id for s in spans)
            _until_acked(acked, store.add_llm_calls, [call])
            with acked.lock:
                acked.calls.append(call.call_id)
            _until_acked(acked, store.add_rewards, [reward])
            with acked.lock:
                acked.rewards.append(reward.reward_id)
            i += 1
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        acked.failures.append(exc)


def test_sigkill_during_concurrent_writes_loses_nothing_acknowledged_and_doubles_nothing(tmp_path):
    token = new_token(16)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    server = StoreProcess(tmp_path / "agl.db", free_port(), token_file, "--expire-every", "0").start()
    # few retries per request, so the outage reaches the writers' own resend loop
    shared = HttpStore(server.url, token=token, retries=2, backoff_s=0.05, timeout_s=10)
    own = HttpStore(server.url, token=token, retries=2, backoff_s=0.05, timeout_s=10)
    acked, stop = Acked(), threading.Event()
    threads = [
        threading.Thread(target=_writer, args=(shared if w < WRITERS - 2 else own, w, acked, stop), daemon=True)
        for w in range(WRITERS)
    ]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: acked.total() >= 400 or acked.failures, "400 writes are acknowledged", 40)
        assert not acked.failures, acked.failures[:3]
        server.kill()  # mid-stream: requests are on the wire right now
        before = acked.snapshot()
        wait_until(lambda: acked.resent or acked.failures, "a write has outlasted its request's own retries", 40)
        server.start()
        more = sum(map(len, before)) + 400
        wait_until(lambda: acked.total() >= more or acked.failures, "400 more writes are acknowledged", 40)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        shared.close()
        own.close()
        server.kill()
    assert not acked.failures, acked.failures[:3]
    assert not any(t.is_alive() for t in threads)
    assert acked.resent > 0  # the kill did hit writes in progress

    with SqliteStore(tmp_path / "agl.db") as store:
        spans = [s.span_id for s in store.query_spans()]
        calls = [c.call_id for c in store.query_llm_calls()]
        rewards = [r.reward_id for r in store.query_rewards()]
    for kind, stored, acked_before, acked_all in (
        ("span", spans, before[0], acked.spans),
        ("llm call", calls, before[1], acked.calls),
        ("reward", rewards, before[2], acked.rewards),
    ):
        assert acked_before <= set(stored), f"{kind}s acknowledged before the kill are gone"
        assert len(stored) == len(set(stored)), f"a {kind} is stored twice"
        # every write in progress at the kill was resent to an acknowledgement, so the store
        # holds exactly what was acknowledged
        assert sorted(stored) == sorted(acked_all), kind
