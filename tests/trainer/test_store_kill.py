"""SIGKILL the store server or a writer mid-stream: every acknowledged write is still there.

The server is the real ``agl store serve`` in a subprocess; writers count what the
store acknowledged, the kill comes without warning, and the store is then read
back from its SQLite file.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from agl.credentials import new_token
from agl.errors import StoreUnavailable
from agl.schema import Rollout, RolloutStatus, Span, Task
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread
from tests.conftest import free_port, wait_until, wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys; from agl_trainer.cli import main; sys.exit(main())"


def _start_server(db: Path, port: int, token: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "store",
            "serve",
            "--store",
            f"sqlite:///{db}",
            "--port",
            str(port),
            f"--admin-token={token}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until_serving(f"http://127.0.0.1:{port}/healthz", proc)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


class Writers:
    """Threads that write spans, enqueue rollouts and claim them, recording what was acknowledged.

    A write that fails is retried with the same ids until it is acknowledged, as a
    runner would; ``stop()`` lets every write in progress finish first.
    """

    def __init__(self, store: HttpStore, n: int):
        self.store = store
        self.acked_spans: list[str] = []
        self.acked_rollouts: list[str] = []
        self.claimed: dict[str, str] = {}  # rollout id -> claim id that got it
        self.failures: list[BaseException] = []
        self.retried = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,)) for w in range(n)]

    def _until_acked(self, fn):
        while True:
            try:
                return fn()
            except StoreUnavailable:
                with self._lock:
                    self.retried += 1
                time.sleep(0.05)  # the server is down: retry the very same write

    def _run(self, w: int) -> None:
        try:
            i = 0
            while not self._stop.is_set():
                spans = [
                    Span(
                        span_id=f"w{w}-s{i}-{k}",
                        rollout_id=f"ro-w{w}-{i}",
                        seq=k,
                        name="chat",
                        kind="llm",
                        attributes={"text": "x" * 200},
                    )
                    for k in range(3)
                ]
                self._until_acked(lambda spans=spans: self.store.add_spans(spans))
                with self._lock:
                    self.acked_spans.extend(s.span_id for s in spans)
                rollout = Rollout(rollout_id=f"ro-w{w}-{i}", task_id="task-0")
                self._until_acked(lambda rollout=rollout: self.store.enqueue([rollout]))
                with self._lock:
                    self.acked_rollouts.append(rollout.rollout_id)
                claim_id = f"claim-w{w}-{i}"
                got = self._until_acked(lambda c=claim_id, r=f"runner-{w}": self.store.claim(r, limit=1, claim_id=c))
                with self._lock:
                    for r in got:
                        assert r.rollout_id not in self.claimed, f"{r.rollout_id} claimed twice"
                        self.claimed[r.rollout_id] = claim_id
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(exc)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def wait_for(self, spans: int, timeout_s: float = 30) -> None:
        def acknowledged() -> bool:
            assert not self.failures, self.failures[:3]
            return len(self.acked_spans) >= spans

        wait_until(
            acknowledged,
            f"{spans} spans are acknowledged",
            timeout_s,
            detail=lambda: f"only {len(self.acked_spans)} were",
        )

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not self.failures, self.failures[:3]


def test_sigkilled_server_loses_nothing_acknowledged(tmp_path):
    db = tmp_path / "agl.db"
    port, token = free_port(), new_token(16)
    with SqliteStore(db) as seed:
        seed.add_tasks([Task(task_id="task-0", input={})])
    server = _start_server(db, port, token)
    client = HttpStore(f"http://127.0.0.1:{port}", token=token, retries=3, backoff_s=0.05, timeout_s=10)
    writers = Writers(client, 8)
    try:
        writers.start()
        writers.wait_for(300)
        _kill(server)  # mid-stream: requests are in flight right now
        before_restart = len(writers.acked_spans)
        wait_until(lambda: writers.retried > 0, "a write has outlasted the client's own retries")
        server = _start_server(db, port, token)
        writers.wait_for(before_restart + 300)
        writers.stop()
    finally:
        client.close()
        _kill(server)

    with SqliteStore(db) as store:
        stored_spans = [s.span_id for s in store.query_spans()]
        rollouts = list(store.query_rollouts())
    assert writers.retried > 0  # the kill did hit writes in progress
    assert set(writers.acked_spans) <= set(stored_spans)
    assert len(stored_spans) == len(set(stored_spans))
    # every write in progress at the kill was retried to an acknowledgement, so the
    # store holds exactly what was acknowledged: nothing lost, nothing doubled
    assert sorted(stored_spans) == sorted(writers.acked_spans)
    assert sorted(r.rollout_id for r in rollouts) == sorted(writers.acked_rollouts)
    running = {r.rollout_id: r for r in rollouts if r.status == RolloutStatus.RUNNING}
    assert set(running) == set(writers.claimed)
    assert all(r.attempt == 1 and r.claim_id == writers.claimed[r.rollout_id] for r in running.values())


WRITER = """
import sys, threading
from agl.schema import Span
backend, where, token = sys.argv[1], sys.argv[2], sys.argv[3]
if backend == "sqlite":
    from agl.store.sqlite import SqliteStore
    store = SqliteStore(where)
else:
    from agl.store.http import HttpStore
    store = HttpStore(where, token=token)
lock = threading.Lock()

def write(w):
    i = 0
    while True:
        spans = [Span(span_id=f"w{w}-{i}-{k}", rollout_id=f"ro-{w}", seq=i * 2 + k, name="s") for k in range(2)]
        store.add_spans(spans)
        with lock:
            sys.stdout.write("".join(s.span_id + "\\n" for s in spans))
            sys.stdout.flush()
        i += 1

for w in range(4):
    threading.Thread(target=write, args=(w,), daemon=True).start()
threading.Event().wait()
"""


def _sigkill_writer(backend: str, where: str, token: str, db: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, backend, where, token], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    acked: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 400 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked.append(line.strip())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        acked.extend(line.strip() for line in proc.stdout.read().splitlines())  # printed before the kill
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert len(acked) >= 400, f"the writer acknowledged only {len(acked)} spans"
    with SqliteStore(db) as store:
        stored = [s.span_id for s in store.query_spans()]
    assert set(acked) <= set(stored)
    assert len(stored) == len(set(stored))


def test_sigkilled_sqlite_writer_loses_nothing_acknowledged(tmp_path):
    db = tmp_path / "agl.db"
    _sigkill_writer("sqlite", str(db), "-", db)


def test_sigkilled_http_writer_loses_nothing_acknowledged(tmp_path):
    db = tmp_path / "agl.db"
    token = new_token(16)
    with SqliteStore(db) as backing, ServerThread(backing, token=token) as server:
        _sigkill_writer("http", server.url, token, db)
