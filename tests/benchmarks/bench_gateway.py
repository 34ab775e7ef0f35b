"""Gateway overhead: the same chat requests sent straight to a fake engine and through the gateway.

Three processes: the fake engine (tests/fake_engine.py), the gateway (``agl gateway serve``
with a real SQLite store, recording every call), and this load generator. For each
concurrency level the same requests go first to the engine directly (the baseline),
then through the gateway; the difference of the latency percentiles is the gateway's
added latency.

The load generator is the gateway's own small HTTP/1.1 client (``raw_http.py``,
``agl_trainer.gateway.upstream``), so that it takes little of the machine from the processes
it measures. ``--httpx`` and ``--aiohttp`` also send the same requests straight to the engine,
in the same run, through one ``httpx.AsyncClient`` (HTTP/1.1, no connection limit,
``trust_env=False``) or one ``aiohttp.ClientSession`` with the levers that make it fastest
(:class:`AiohttpClient`): what each library would cost as the gateway's engine client over
the hand-written one. ``bench_gateway_ab`` compares two checkouts' whole gateways.

    .venv/bin/python -m tests.benchmarks.bench_gateway [--requests 3000] [--concurrency 1 64] [--httpx] [--aiohttp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.benchmarks.raw_http import ConnectionPool, Endpoint
from tests.conftest import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-token"
BODY = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "max_tokens": 64,
    "temperature": 0.7,
}


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def servers(tmp: str, pythonpath: str | None = None):
    """The fake engine and the gateway, each in its own process, on 127.0.0.1.

    They import this checkout's code (``pythonpath``, else the repository root first on
    the caller's ``PYTHONPATH``), not whatever the virtual environment installed.
    """
    inherited = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=pythonpath or os.pathsep.join(filter(None, [str(ROOT), inherited])))
    eport, gport = free_port(), free_port()
    procs = []
    try:
        engine = subprocess.Popen([sys.executable, "-m", "tests.fake_engine", "--port", str(eport)], cwd=ROOT, env=env)
        procs.append(engine)
        _wait_ready(f"http://127.0.0.1:{eport}/v1/models", engine)
        gateway = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "agl"),
                "gateway",
                "serve",
                "--store",
                f"sqlite:///{tmp}/agl.db",
                "--upstream",
                f"http://127.0.0.1:{eport}/v1",
                "--port",
                str(gport),
                "--gateway-token",
                TOKEN,
                "--max-in-flight",
                "100000",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        procs.append(gateway)
        _wait_ready(f"http://127.0.0.1:{gport}/v1/models", gateway)
        yield f"http://127.0.0.1:{eport}/v1", f"http://127.0.0.1:{gport}/v1", f"{tmp}/agl.db"
    finally:
        for p in reversed(procs):
            stop_process(p, timeout_s=15)


class AiohttpClient:
    """aiohttp tuned as an engine client, as the gateway used it until it went back to its own
    client: one ``ClientSession`` on a ``TCPConnector`` with no limit and 4 s keep-alive, no proxy
    lookup, no decompression, every header fixed on the session (per-request headers and
    ``skip_auto_headers`` cost aiohttp time), bodies read with ``read()``."""

    def __init__(self, base_url: str, headers: dict[str, str]):
        self.base_url = base_url
        self.headers = {"User-Agent": "agl-bench", "Content-Type": "application/json", **headers}
        self._session = None

    async def post(self, path: str, payload: bytes) -> tuple[int, bytes]:
        import aiohttp  # only for this comparison: agl does not depend on it

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                headers={"Accept-Encoding": "identity", **self.headers},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
                auto_decompress=False,
                trust_env=False,
            )
        async with self._session.post(self.base_url + path, data=payload) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Clients:
    """One client of each kind to the same base URL; ``send`` POSTs through the one named
    (``own``: the hand-written load generator)."""

    def __init__(self, base_url: str):
        auth = {"Authorization": f"Bearer {TOKEN}"}
        self.base_url = base_url
        self.pool = ConnectionPool(Endpoint.parse(base_url), headers=auth)
        self.httpx = httpx.AsyncClient(
            base_url=base_url,
            headers=auth,
            http1=True,
            http2=False,
            trust_env=False,
            timeout=httpx.Timeout(None, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self.aiohttp = AiohttpClient(base_url, auth)

    async def send(self, engine: str, path: str, payload: bytes) -> tuple[int, bytes]:
        if engine == "httpx":
            resp = await self.httpx.post(path, content=payload, headers={"Content-Type": "application/json"})
            return resp.status_code, resp.content
        if engine == "aiohttp":
            return await self.aiohttp.post(path, payload)
        resp = await self.pool.request("POST", path, payload)
        return resp.status, await resp.read()

    async def close(self) -> None:
        await self.pool.close()
        await self.httpx.aclose()
        await self.aiohttp.close()


async def _load(
    base_url: str, path: str, body: dict, requests: int, concurrency: int, engine: str = "own"
) -> tuple[list[float], float]:
    """Send ``requests`` POSTs from ``concurrency`` clients through ``engine`` (own, httpx or aiohttp).

    Returns the latencies in seconds and the wall time.
    """
    clients = _Clients(base_url)
    payload = json.dumps(body).encode()
    latencies: list[float] = []
    left = requests
    dropped = 0

    async def client() -> None:
        nonlocal left, dropped
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            try:
                status, data = await clients.send(engine, path, payload)
            except (httpx.TransportError, ConnectionError):  # httpx: a keep-alive connection the engine closed
                dropped += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"{status}: {data[:300]!r}")

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await clients.close()
    if dropped:
        print(f"{base_url}: {dropped} of {requests} requests failed with a transport error ({engine})")
    return latencies, wall


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def run_load(base_url: str, path: str, body: dict, requests: int, concurrency: int, engine: str = "own") -> dict:
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    lat, wall = runner(_load(base_url, path, body, requests, concurrency, engine))
    return {"p50_ms": _pct(lat, 50) * 1e3, "p99_ms": _pct(lat, 99) * 1e3, "calls_s": len(lat) / wall}


def compare(
    direct: str,
    via: str,
    path: str,
    body: dict,
    requests: int,
    levels: list[int],
    label: str,
    via_path: str | None = None,
    via_body: dict | None = None,
    libraries: tuple[str, ...] = (),
) -> list[dict]:
    """Warm both paths, then measure each concurrency level: the baseline first, then the measured path.

    Each of ``libraries`` (``httpx``, ``aiohttp``) also measures the baseline through that library (its own row).
    """
    via_path, via_body = via_path or path, via_body or body
    run_load(direct, path, body, 200, 8)
    run_load(via, via_path, via_body, 200, 8)
    for engine in libraries:
        run_load(direct, path, body, 200, 8, engine)
    rows = []
    for c in levels:
        base = run_load(direct, path, body, requests, c)
        measured = run_load(via, via_path, via_body, requests, c)
        row = {"label": label, "concurrency": c, "base": base, "gw": measured}
        row["libraries"] = {engine: run_load(direct, path, body, requests, c, engine) for engine in libraries}
        rows.append(row)
    return rows


def print_rows(rows: list[dict], base_name: str, via_name: str) -> None:
    print(
        f"{'requests':<22}{'clients':>8}  {'p50 ms':>16}  {'p99 ms':>16}  {'calls/s':>16}  {'added p50':>10}"
        f"  {'added p99':>10}"
    )
    for r in rows:
        b, g = r["base"], r["gw"]
        measured = [(base_name, b), (via_name, g)]
        measured += [(f"{base_name} {engine}", m) for engine, m in r.get("libraries", {}).items()]
        for name, m in measured:
            print(
                f"{r['label'] + ' ' + name:<22}{r['concurrency']:>8}  {m['p50_ms']:>16.3f}  {m['p99_ms']:>16.3f}"
                f"  {m['calls_s']:>16.0f}",
                end="",
            )
            if m is not b:
                print(f"  {m['p50_ms'] - b['p50_ms']:>10.3f}  {m['p99_ms'] - b['p99_ms']:>10.3f}")
            else:
                print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--httpx", action="store_true", help="also measure the engine alone through httpx")
    parser.add_argument("--aiohttp", action="store_true", help="also measure the engine alone through aiohttp")
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        "engine, gateway and load generator in separate processes"
    )
    tmp = tempfile.mkdtemp(prefix="agl-bench-")
    try:
        with servers(tmp) as (direct, via, db):
            libraries = tuple(name for name in ("httpx", "aiohttp") if getattr(args, name))
            rows = compare(
                direct, via, "/chat/completions", BODY, args.requests, args.concurrency, "chat", libraries=libraries
            )
        from agl.store.sqlite import SqliteStore

        with SqliteStore(db) as store:  # the gateway wrote out its buffer when it stopped
            recorded = store.stats().llm_calls
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine skews the figures)")
    print_rows(rows, "direct", "gateway")
    sent = 200 + args.requests * len(args.concurrency)
    print(f"recorded {recorded} LLM calls for {sent} requests through the gateway")
    print("targets: <= 1 ms added p50 latency, >= 1500 calls/s through the gateway at 64 clients")
    for name in libraries:
        print(
            f"'direct {name}': the engine alone through {name}; its 'added' is {name}'s cost over the "
            "hand-written client of the load generator"
        )


if __name__ == "__main__":
    main()
