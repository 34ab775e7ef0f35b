"""Soak: the reliability fuzzer and concurrent writers against the store server and the gateway for a while.

Run: ``.venv/bin/python -m tests.benchmarks.bench_soak [--duration S] [--writers N] [--quick]``

The store server is ``agl store serve`` in a subprocess (SQLite file, 127.0.0.1, token
from a file), so its memory is its own; writer threads write spans, LLM calls and
rewards through agl's HTTP client. The gateway runs in this process in front of the
fake engine (tests/fake_engine.py), with client threads sending normal chat requests.

Baseline, measured in the same run: the writers (and the gateway's clients) alone for
a quarter of the duration; then the same load with the seeded fuzzer
(:mod:`tests.reliability.fuzz`) sending one seed after another at both servers for the
duration. Printed: requests by status, 5xx and unanswered counts (any is a failure,
with seed and request, and a non-zero exit), writes per second with and without the
fuzzer, the store server's RSS at start, after the baseline and at the end (with the
peak sampled every 100 ms), this process's RSS for the gateway, and how many of the
gateway's call records its writer had written and still held at the end (the gateway,
the fake engine and every client share this process's GIL, so the writer's rate here is
a floor, not the gateway's own).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from agl.credentials import RolloutKeys, new_token
from agl.schema import LLMCall, Reward, Rollout, Span, Task
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from tests.conftest import free_port
from tests.reliability.conftest import StoreProcess
from tests.reliability.fuzz import Fuzzer, Outcome, Target, run
from tests.reliability.targets import MODEL, gateway_routes, gateway_target, store_routes


class Load:
    """Threads doing normal work until stopped; ``done`` counts what was acknowledged, ``errors`` what was not."""

    def __init__(self, work, n: int):
        self.done = 0
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(work, w), daemon=True) for w in range(n)]

    def _run(self, work, w: int) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                work(w, i)
            except Exception as exc:  # counted and shown: the soak goes on
                with self._lock:
                    self.errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            else:
                with self._lock:
                    self.done += 1
            i += 1

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def _store_writes(store: HttpStore):
    def work(w: int, i: int) -> None:
        rollout = f"soak-{w}-{i // 20}"
        store.add_spans([Span(span_id=f"s-{w}-{i}-{k}", rollout_id=rollout, seq=i, name="step") for k in range(3)])
        store.add_llm_calls([LLMCall(call_id=f"c-{w}-{i}", rollout_id=rollout, prompt_ids=[1] * 200, response_ids=[2])])
        store.add_rewards([Reward(reward_id=f"r-{w}-{i}", rollout_id=rollout, value=0.5)])

    return work


def _gateway_chats(target: Target):
    client = httpx.Client(base_url=target.url, timeout=30)
    headers = {"Authorization": f"Bearer {target.credentials['production']}"}

    def work(w: int, i: int) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"soak {w} {i}"}], "max_tokens": 16}
        answer = client.post("/v1/chat/completions", json=body, headers=headers)
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code} {answer.text[:100]}")

    return work


class Peak:
    """Samples a process's RSS every 100 ms; ``peak`` in MiB."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> float:
        return self.proc.memory_info().rss / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.now())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _fuzz(routes, target: Target, until: float, first_seed: int, per_seed: int, totals: Outcome) -> None:
    seed = first_seed
    while time.monotonic() < until:
        outcome = run(Fuzzer(seed, routes), target, per_seed)
        totals.sent += outcome.sent
        totals.failures += outcome.failures
        for status, count in outcome.statuses.items():
            totals.statuses[status] = totals.statuses.get(status, 0) + count
        seed += 1
    totals.seed = seed - first_seed  # seeds run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of fuzzing under load (default 120)")
    parser.add_argument("--writers", type=int, default=4, help="store writer threads (default 4)")
    parser.add_argument("--chatters", type=int, default=2, help="gateway client threads (default 2)")
    parser.add_argument("--per-seed", type=int, default=300, help="fuzz requests per seed (default 300)")
    parser.add_argument("--quick", action="store_true", help="--duration 20")
    args = parser.parse_args()
    duration = 20.0 if args.quick else args.duration
    baseline_s = duration / 4

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        token, runner_token, keys = new_token(16), new_token(16), RolloutKeys.generate()
        for name, secret in (("token", token), ("runner", runner_token), ("keys", keys.secret)):
            (tmp / name).write_text(secret)
        with SqliteStore(tmp / "soak.db") as seed:  # what the fuzzer's routes name: a running and a queued rollout
            seed.add_tasks([Task(task_id="task-1", input={"q": 1})])
            seed.enqueue(
                [Rollout(rollout_id="ro-run", task_id="task-1"), Rollout(rollout_id="ro-queued", task_id="task-1")]
            )
            [running] = seed.claim("runner-0", limit=1)
        extra = ["--runner-token-file", str(tmp / "runner"), "--rollout-key-secret-file", str(tmp / "keys")]
        server = StoreProcess(tmp / "soak.db", free_port(), tmp / "token", *extra).start()
        store = HttpStore(server.url, token=token)
        credentials = {"admin": token, "runner": runner_token, "key": keys.mint("ro-run", running.attempt)}
        store_target = Target(
            server.url, credentials | {"production": new_token(16)}, {"rollout": "ro-run", "queued": "ro-queued"}
        )
        try:
            with gateway_target(tmp) as (gw_target, gateway):
                store_peak, self_peak = Peak(server.proc.pid), Peak(psutil.Process().pid)
                rss_start, self_start = store_peak.now(), self_peak.now()

                writes = Load(_store_writes(store), args.writers).start()
                chats = Load(_gateway_chats(gw_target), args.chatters).start()
                time.sleep(baseline_s)
                base_writes, base_chats = writes.done, chats.done
                rss_base = store_peak.now()

                started = time.monotonic()
                until = started + duration
                store_fuzz, gateway_fuzz = Outcome(0), Outcome(0)
                fuzzers = [
                    threading.Thread(
                        target=_fuzz, args=(store_routes(), store_target, until, 1, args.per_seed, store_fuzz)
                    ),
                    threading.Thread(
                        target=_fuzz, args=(gateway_routes(), gw_target, until, 1, args.per_seed, gateway_fuzz)
                    ),
                ]
                for t in fuzzers:
                    t.start()
                for t in fuzzers:
                    t.join()
                fuzzed_s = time.monotonic() - started
                writes.stop()
                chats.stop()
                load_writes, load_chats = writes.done - base_writes, chats.done - base_chats
                alive = httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
                alive = alive and httpx.get(f"{gw_target.url}/health", timeout=10).status_code == 200
                store_peak.stop()
                self_peak.stop()
                rss_end, self_end = store_peak.now(), self_peak.now()
                recorded, backlog = gateway.writer.written, gateway.writer.pending()
        finally:
            store.close()
            store_target.close()
            server.stop()

    print(f"soak: {duration:.0f} s of fuzzing under load, after a {baseline_s:.0f} s baseline of the load alone")
    for name, outcome in (("store server", store_fuzz), ("gateway", gateway_fuzz)):
        fives = sum(c for s, c in outcome.statuses.items() if s >= 500)
        statuses = ", ".join(f"{s}: {c}" for s, c in sorted(outcome.statuses.items()))
        print(
            f"  {name} fuzz: {outcome.sent} requests over {outcome.seed} seeds, {fives} 5xx, "
            f"{len(outcome.failures)} failures; statuses {statuses}"
        )
        for failure in outcome.failures[:5]:
            print(f"    {failure[:600]}")
    print(
        f"  store writes (3 calls each): {base_writes / baseline_s:.1f}/s alone (baseline), "
        f"{load_writes / fuzzed_s:.1f}/s under the fuzzer; errors {dict(writes.errors) or 'none'}"
    )
    print(
        f"  gateway chats: {base_chats / baseline_s:.1f}/s alone (baseline), {load_chats / fuzzed_s:.1f}/s under "
        f"the fuzzer; errors {dict(chats.errors) or 'none'}"
    )
    print(
        f"  store server RSS: {rss_start:.0f} MiB at start, {rss_base:.0f} after the baseline, "
        f"{rss_end:.0f} at the end, peak {store_peak.peak:.0f}"
    )
    print(
        f"  this process (gateway, fake engine, clients) RSS: {self_start:.0f} MiB at start, "
        f"{self_end:.0f} at the end, peak {self_peak.peak:.0f}"
    )
    print(f"  gateway's call records: {recorded} written, {backlog} still buffered at the end of the load")
    print(f"  both servers answer their health check afterwards: {alive}")
    failed = store_fuzz.failures or gateway_fuzz.failures or writes.errors or chats.errors or not alive
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
