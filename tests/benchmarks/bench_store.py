"""Store throughput, latency and memory: W1 (a realistic rollout) and W2 (empty rollouts).

Run: ``.venv/bin/python -m tests.benchmarks.bench_store [--quick]``

W1: N rollouts (1000; 200 with --quick), each claimed, given 6 LLM spans (about 2 KB
of prompt/response text in attributes), 6 LLM call records (500 prompt and 100
response token ids, with logprobs) and a reward, then finished; with 1, 32 and 256
concurrent writer threads. The 6 spans go in one ``add_spans`` call, as the capture
writer's buffer would send them. Measured for the embedded SQLite store, the HTTP
server in a subprocess (``agl store serve``, client load in this process) and
PostgreSQL (when tests/pg.py can start one).

W2: claim + finish of 10,000 empty rollouts (2,000 with --quick) by 256 runner
threads over HTTP.

Baselines measured in the same run: for the embedded store, plain sqlite3 with one
INSERT per row and a commit per rollout (what a naive store does); over HTTP, the
same server driven without coalescing (one request per store call). Over HTTP the
coalescing client is also run with its ``/v1/batch`` requests sent by its
``httpx.Client`` ("batches over httpx"), the figure that keeps its ``http.client``
batch connections (see :mod:`agl.store.http`).

Latency is per store call (claim, add_spans, add_llm_calls, add_rewards, finish).
Peak RSS is sampled every 20 ms during the run: this process for the embedded
store, server and client for HTTP.

Each writer builds its payload objects once and points them at each rollout it
writes (see :class:`RolloutPayload`), and the clock starts once every writer thread
is waiting at the line: what is timed is the store's work, not the benchmark's. The
embedded store and its baseline take turns ``--repeat`` times (3) per writer count
and the median run is reported, since this shared 2-CPU host's speed moves by 20-30 %
from one second to the next.

``--beside COMMIT`` runs only the store over HTTP beside another commit's store server,
the two taking turns under the same load, and prints both and their ratio (see
:mod:`tests.benchmarks.store_beside`), e.g. ``--beside 9058dec --rollouts 500 --repeat 3``.

Figures from a quiet host are in docs/results/benchmarks.md's table, next to their
same-run baselines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span, Task
from agl.store.base import Store
from agl.store.http import _ADAPTERS as _LISTS
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from tests.benchmarks import store_beside

ROOT = Path(__file__).resolve().parents[2]
SPANS_PER_ROLLOUT = 6
PROMPT_TEXT = ("You are a careful assistant. Solve the task step by step and answer briefly. " * 13)[:1000]
RESPONSE_TEXT = ("Let me think about this. First we add the numbers, then we check the result. " * 13)[:1000]
PROMPT_IDS = list(range(1000, 1500))
RESPONSE_IDS = list(range(2000, 2100))
LOGPROBS = [-0.25] * 100


class RssSampler:
    """The peak resident memory of some processes, sampled on a thread."""

    def __init__(self, pids: list[int], every_s: float = 0.02):
        self.procs = [psutil.Process(pid) for pid in pids]
        self.peaks = [p.memory_info().rss for p in self.procs]
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for i, p in enumerate(self.procs):
                with contextlib.suppress(psutil.Error):
                    self.peaks[i] = max(self.peaks[i], p.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f}"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- workloads --------------------------------------------------------------------
def _seed(store: Store, rollouts: int) -> None:
    tasks = [Task(task_id=f"task-{i}", input={"question": f"what is {i} + {i}?", "answer": 2 * i}) for i in range(100)]
    store.add_tasks(tasks)
    for start in range(0, rollouts, 500):
        store.enqueue([Rollout(task_id=f"task-{i % 100}") for i in range(start, min(rollouts, start + 500))])


def _templates() -> tuple[Span, LLMCall]:
    span = Span(
        rollout_id="ro-template",
        name="chat",
        kind="llm",
        status="ok",
        end_time=time.time(),
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "policy",
            "gen_ai.response.id": "chatcmpl-template",
            "gen_ai.agent.name": "solver",
            "gen_ai.usage.input_tokens": 500,
            "gen_ai.usage.output_tokens": 100,
            "gen_ai.input.messages": PROMPT_TEXT,
            "gen_ai.output.messages": RESPONSE_TEXT,
        },
    )
    call = LLMCall(
        call_id="chatcmpl-template",
        requested_model="policy",
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"id": "chatcmpl-template"},
        prompt_ids=PROMPT_IDS,
        response_ids=RESPONSE_IDS,
        response_logprobs=LOGPROBS,
        model_version="v0",
        latency_s=0.05,
    )
    return span, call


_SPAN, _CALL = _templates()


class RolloutPayload:
    """One writer's observations of a rollout: built once, then pointed at each rollout it writes.

    An agent builds its spans and calls while it runs; this benchmark measures the
    store, so each writer builds its 6 spans, 6 calls and reward once and, for each
    rollout, only gives them that rollout's id and fresh ids of their own. A store
    call has taken what it stores by the time it returns (the embedded store has
    committed the rows, the HTTP client has had them acknowledged), so pointing the
    same objects at the next rollout changes nothing already stored.
    """

    def __init__(self) -> None:
        self.spans = [
            _SPAN.model_copy(update={"seq": k, "attributes": dict(_SPAN.attributes)}) for k in range(SPANS_PER_ROLLOUT)
        ]
        self.calls = [_CALL.model_copy(update={"seq": k}) for k in range(SPANS_PER_ROLLOUT)]
        self.rewards = [Reward(rollout_id="ro-template", value=1.0)]

    def aim(self, rollout_id: str) -> tuple[list[Span], list[LLMCall], list[Reward]]:
        for k, (span, call) in enumerate(zip(self.spans, self.calls, strict=False)):
            call_id = f"chatcmpl-{rollout_id}-{k}"
            span.span_id = f"{rollout_id}-{k}"
            span.rollout_id = call.rollout_id = rollout_id
            span.attributes["gen_ai.response.id"] = call.call_id = call_id
        reward = self.rewards[0]
        reward.reward_id = f"rw-{rollout_id}"
        reward.rollout_id = rollout_id
        return self.spans, self.calls, self.rewards


def _timed(latencies: list[float], fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    latencies.append(time.perf_counter() - t0)
    return result


def _run_threads(work: Callable[[int], None], n: int, what: str) -> float:
    """Run ``work(i)`` on ``n`` threads at once; the wall time, or the first error raised.

    The clock starts once every thread has started and waits at the line, so starting
    256 threads is not counted as the store's time.
    """
    errors: list[BaseException] = []
    line = threading.Barrier(n + 1)

    def guarded(i: int) -> None:
        line.wait()
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    line.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} {what} failed; first: {errors[0]!r}") from errors[0]
    return elapsed


def run_w1(store: Store, writers: int, rollouts: int) -> dict[str, float]:
    """Claim, observe and finish ``rollouts`` rollouts with ``writers`` threads."""
    latencies: list[list[float]] = [[] for _ in range(writers)]
    done = [0] * writers

    def writer(w: int) -> None:
        lat = latencies[w]
        payload = RolloutPayload()
        while True:
            claimed = _timed(lat, store.claim, f"runner-{w}")
            if not claimed:
                return
            rollout_id = claimed[0].rollout_id
            spans, calls, rewards = payload.aim(rollout_id)
            _timed(lat, store.add_spans, spans)
            _timed(lat, store.add_llm_calls, calls)
            _timed(lat, store.add_rewards, rewards)
            _timed(lat, store.finish, rollout_id, RolloutStatus.SUCCEEDED, output="4")
            done[w] += 1

    elapsed = _run_threads(writer, writers, "writers")
    if sum(done) != rollouts:
        raise RuntimeError(f"finished {sum(done)} of {rollouts} rollouts")
    flat = [x for lat in latencies for x in lat]
    return {
        "rollouts/s": rollouts / elapsed,
        "spans/s": rollouts * SPANS_PER_ROLLOUT / elapsed,
        "p50 ms": statistics.median(flat) * 1000,
        "p99 ms": _pct(flat, 0.99) * 1000,
        "seconds": elapsed,
    }


def run_w2(store: Store, runners: int, rollouts: int) -> dict[str, float]:
    """Claim and finish ``rollouts`` empty rollouts with ``runners`` threads."""
    latencies: list[list[float]] = [[] for _ in range(runners)]
    done = [0] * runners

    def runner(w: int) -> None:
        while True:
            claimed = _timed(latencies[w], store.claim, f"runner-{w}")
            if not claimed:
                return
            _timed(latencies[w], store.finish, claimed[0].rollout_id, RolloutStatus.SUCCEEDED)
            done[w] += 1

    elapsed = _run_threads(runner, runners, "runners")
    flat = [x for lat in latencies for x in lat]
    return {
        "rollouts/s": sum(done) / elapsed,
        "p50 ms": statistics.median(flat) * 1000,
        "p99 ms": _pct(flat, 0.99) * 1000,
        "seconds": elapsed,
    }


# -- baselines --------------------------------------------------------------------
class NaiveSqliteStore:
    """Baseline: plain sqlite3, one INSERT per row, a commit per store call, one lock."""

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("CREATE TABLE rollouts (rollout_id TEXT PRIMARY KEY, status TEXT, body TEXT)")
        self.conn.execute("CREATE TABLE rows (id TEXT PRIMARY KEY, rollout_id TEXT, body TEXT)")
        self.lock = threading.Lock()

    def add_tasks(self, tasks) -> None:
        pass

    def enqueue(self, rollouts) -> None:
        with self.lock:
            self.conn.execute("BEGIN")
            for r in rollouts:
                self.conn.execute("INSERT INTO rollouts VALUES (?, 'queued', ?)", (r.rollout_id, r.model_dump_json()))
            self.conn.execute("COMMIT")

    def claim(self, runner_id: str) -> list[Rollout]:
        with self.lock:
            row = self.conn.execute("SELECT rollout_id FROM rollouts WHERE status = 'queued' LIMIT 1").fetchone()
            if row is None:
                return []
            self.conn.execute("UPDATE rollouts SET status = 'running' WHERE rollout_id = ?", row)
            return [Rollout(rollout_id=row[0], task_id="t", status=RolloutStatus.RUNNING)]

    def _insert(self, rows) -> None:
        with self.lock:
            self.conn.execute("BEGIN")
            for key, rollout_id, body in rows:
                self.conn.execute("INSERT INTO rows VALUES (?, ?, ?)", (key, rollout_id, body))
            self.conn.execute("COMMIT")

    def add_spans(self, spans) -> None:
        self._insert((s.span_id, s.rollout_id, s.model_dump_json()) for s in spans)

    def add_llm_calls(self, calls) -> None:
        self._insert((c.call_id, c.rollout_id, c.model_dump_json()) for c in calls)

    def add_rewards(self, rewards) -> None:
        self._insert((r.reward_id, r.rollout_id, r.model_dump_json()) for r in rewards)

    def finish(self, rollout_id, status, **_) -> None:
        with self.lock:
            self.conn.execute(
                "UPDATE rollouts SET status = ? WHERE rollout_id = ?", (RolloutStatus(status).value, rollout_id)
            )

    def close(self) -> None:
        self.conn.close()


class UncoalescedHttpStore(HttpStore):
    """Baseline: the same server, one request per store call (no coalescing)."""

    def add_spans(self, spans) -> None:
        self._post("/v1/spans", b'{"spans":' + _LISTS["spans"].dump_json(list(spans)) + b"}")

    def add_llm_calls(self, calls) -> None:
        self._post("/v1/llm_calls", b'{"llm_calls":' + _LISTS["llm_calls"].dump_json(list(calls)) + b"}")

    def add_rewards(self, rewards) -> None:
        self._post("/v1/rewards", b'{"rewards":' + _LISTS["rewards"].dump_json(list(rewards)) + b"}")

    def claim(self, runner_id, *, limit=1, claim_id=None):
        answer = self._post(
            "/v1/claims", {"runner_id": runner_id, "limit": limit, "claim_id": claim_id or secrets.token_hex(8)}
        )
        return [Rollout.model_validate(r) for r in answer.json()["rollouts"]]

    def finish(self, rollout_id, status, *, error=None, output=None, attempt=None):
        body = {"status": RolloutStatus(status).value, "error": error, "output": output, "attempt": attempt}
        answer = self._post(f"/v1/rollouts/{rollout_id}/finish", body)
        return Rollout.model_validate_json(answer.content)


class HttpxBatchHttpStore(HttpStore):
    """Comparison: the coalescing client with its ``/v1/batch`` requests sent by the ``httpx.Client`` too."""

    def __init__(self, url: str, **options) -> None:
        super().__init__(url, **options)
        self._batch.close()
        self._batch = None


# -- backends ---------------------------------------------------------------------
@contextlib.contextmanager
def http_server(db: Path) -> Iterator[tuple[str, str, int]]:
    """``agl store serve`` of this checkout in a subprocess over a SQLite file; yields (url, token, pid)."""
    with store_beside.tree_server(ROOT, db) as served:
        yield served


@contextlib.contextmanager
def postgres_databases() -> Iterator[Callable[[], Store] | str]:
    """A factory of PostgresStores, each on a fresh database of one throwaway server, or why not."""
    try:
        from agl.store.postgres import PostgresStore
        from tests.pg import create_database, postgres_server
    except ImportError as exc:
        yield f"tests/pg.py not available ({exc})"
        return
    server = postgres_server()
    try:
        base_url = server.__enter__()
    except Exception as exc:  # noqa: BLE001 - no PostgreSQL on this machine: reported, not fatal
        yield f"could not start PostgreSQL ({exc})"
        return
    try:
        yield lambda: PostgresStore(create_database(base_url))
    finally:
        server.__exit__(None, None, None)


# -- the run ----------------------------------------------------------------------
ROWS: list[tuple[str, ...]] = []


def report(workload: str, backend: str, writers: int, result: dict[str, float], rss: str) -> None:
    row = (
        workload,
        backend,
        str(writers),
        f"{result['rollouts/s']:.0f}",
        f"{result['spans/s']:.0f}" if "spans/s" in result else "",
        f"{result['p50 ms']:.2f}",
        f"{result['p99 ms']:.1f}",
        rss,
    )
    ROWS.append(row)
    print("  " + "  ".join(row), flush=True)


def bench_embedded(tmp: Path, writer_counts: list[int], rollouts: int, repeat: int) -> None:
    """W1 on the embedded store and the sqlite3 baseline, taking turns ``repeat`` times per
    writer count; each reports its median run (by spans/s) and prints every run's figure."""
    stores: list[tuple[str, Callable[[Path], Store]]] = [
        ("baseline: sqlite3, row at a time", NaiveSqliteStore),
        ("embedded SQLite", SqliteStore),
    ]
    for writers in writer_counts:
        runs: dict[str, list[tuple[dict[str, float], str]]] = {name: [] for name, _ in stores}
        for turn in range(repeat):
            for name, open_store in stores:
                store = open_store(tmp / f"{name.split(':')[0].split()[0]}-{writers}-{turn}.db")
                _seed(store, rollouts)
                with RssSampler([os.getpid()]) as rss:
                    result = run_w1(store, writers, rollouts)
                store.close()
                runs[name].append((result, _mib(rss.peaks[0])))
        for name, _ in stores:
            ordered = sorted(runs[name], key=lambda run: run[0]["spans/s"])
            if repeat > 1:
                spans = ", ".join(f"{run[0]['spans/s']:.0f}" for run in runs[name])
                print(f"  W1  {name}  {writers}: spans/s in turn {spans}; the median run:", flush=True)
            report("W1", name, writers, *ordered[len(ordered) // 2])


def bench_growth(tmp: Path, rounds: int, rollouts: int) -> None:
    """Peak RSS per round while the same store grows by ``rollouts`` each round."""
    store = SqliteStore(tmp / "growth.db")
    peaks = []
    for _r in range(rounds):
        _seed(store, rollouts)
        with RssSampler([os.getpid()]) as rss:
            run_w1(store, 32, rollouts)
        # reading everything back streams: memory stays flat as the store grows
        with RssSampler([os.getpid()]) as read_rss:
            n = sum(1 for _ in store.query_spans())
        peaks.append((store.stats().spans, rss.peaks[0], read_rss.peaks[0], n))
    store.close()
    print("  RSS as the embedded store grows (32 writers):", flush=True)
    for spans, write_peak, read_peak, n in peaks:
        print(
            f"    {spans:>7} spans stored: write peak {_mib(write_peak)} MiB,"
            f" full scan of {n} spans peak {_mib(read_peak)} MiB"
        )


HTTP_CLIENTS = (
    ("baseline: HTTP, request per call", UncoalescedHttpStore),
    ("HTTP, batches over httpx", HttpxBatchHttpStore),
    ("HTTP server (coalescing)", HttpStore),
)


def bench_http(tmp: Path, writer_counts: list[int], rollouts: int) -> None:
    for writers in writer_counts:
        for label, cls in HTTP_CLIENTS:
            db = tmp / f"http-{HTTP_CLIENTS.index((label, cls))}-{writers}.db"
            with http_server(db) as (url, token, pid):
                store = cls(url, token=token)
                _seed(store, rollouts)
                with RssSampler([pid, os.getpid()]) as rss:
                    result = run_w1(store, writers, rollouts)
                store.close()
            report("W1", label, writers, result, f"{_mib(rss.peaks[0])} srv / {_mib(rss.peaks[1])} cli")


def bench_postgres(writer_counts: list[int], rollouts: int) -> None:
    with postgres_databases() as open_store:
        if isinstance(open_store, str):
            print(f"  postgres: skipped ({open_store})", flush=True)
            return
        for writers in writer_counts:
            store = open_store()
            try:
                _seed(store, rollouts)
                with RssSampler([os.getpid()]) as rss:
                    result = run_w1(store, writers, rollouts)
            finally:
                store.close()
            report("W1", "PostgreSQL", writers, result, _mib(rss.peaks[0]))


def bench_w2(tmp: Path, runners: int, rollouts: int) -> None:
    for label, cls in HTTP_CLIENTS:
        with http_server(tmp / f"w2-{HTTP_CLIENTS.index((label, cls))}.db") as (url, token, pid):
            store = cls(url, token=token)
            store.add_tasks([Task(task_id="t", input={})])
            for start in range(0, rollouts, 1000):
                store.enqueue([Rollout(task_id="t") for _ in range(min(1000, rollouts - start))])
            with RssSampler([pid, os.getpid()]) as rss:
                result = run_w2(store, runners, rollouts)
            stats = store.stats()
            store.close()
        assert stats.rollouts == {"succeeded": rollouts}, stats.rollouts
        report("W2", label, runners, result, f"{_mib(rss.peaks[0])} srv / {_mib(rss.peaks[1])} cli")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (200 W1 rollouts, 2,000 W2 rollouts)")
    parser.add_argument("--only", choices=["embedded", "http", "postgres", "w2", "growth"], action="append")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument(
        "--beside",
        metavar="COMMIT",
        help="only: the store over HTTP beside COMMIT's, taking turns --repeat times per client count, "
        "and their ratio (see tests/benchmarks/store_beside.py)",
    )
    parser.add_argument("--rollouts", type=int, metavar="N", help="W1 rollouts a run (default 1000; 200 with --quick)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="W1 runs per writer count, embedded store and baseline (or, with --beside, the two servers) taking turns;"
        " the median is reported (default 3)",
    )
    args = parser.parse_args(argv)
    w1_rollouts = args.rollouts or (200 if args.quick else 1000)
    w2_rollouts = 2000 if args.quick else 10_000
    writer_counts = [1, 32, 256]
    if args.beside:
        rows = store_beside.compare(args.beside, writer_counts, w1_rollouts, max(1, args.repeat))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    only = set(args.only or ["embedded", "growth", "http", "postgres", "w2"])
    print(
        f"store benchmark on {os.cpu_count()} CPUs; W1 = {w1_rollouts} rollouts x {SPANS_PER_ROLLOUT} spans", flush=True
    )
    print("  workload  backend  writers  rollouts/s  spans/s  p50 ms  p99 ms  peak RSS MiB", flush=True)
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmpdir:
        tmp = Path(tmpdir)
        if "embedded" in only:
            bench_embedded(tmp, writer_counts, w1_rollouts, max(1, args.repeat))
        if "growth" in only:
            bench_growth(tmp, 8, w1_rollouts)
        if "http" in only:
            bench_http(tmp, writer_counts, w1_rollouts)
        if "postgres" in only:
            bench_postgres(writer_counts, w1_rollouts)
        if "w2" in only:
            bench_w2(tmp, 256, w2_rollouts)
    _print_table()
    if args.json:
        Path(args.json).write_text(json.dumps(ROWS, indent=1))
    return 0


def _print_table() -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "workload",
        "backend",
        "writers",
        "rollouts/s",
        "spans/s",
        "p50 ms",
        "p99 ms",
        "peak RSS MiB",
        title="store benchmark (targets: W1 embedded >= 20,000 spans/s, W1 HTTP >= 5,000 spans/s,"
        " W2 >= 1,000 rollouts/s)",
    )
    for row in ROWS:
        table.add_row(*row)
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(main())
