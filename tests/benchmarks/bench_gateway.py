"""Gateway overhead: the same chat requests sent straight to a fake engine and through the gateway.

Three processes: the fake engine (tests/fake_engine.py), the gateway (``agl gateway serve``
with a real SQLite store, recording every call), and this load generator. For each
concurrency level the same requests go first to the engine directly (the baseline),
then through the gateway; the difference of the latency percentiles is the gateway's
added latency.

``--httpx`` also sends the same requests straight to the engine with one
``httpx.AsyncClient`` (HTTP/1.1, no connection limit, ``trust_env=False``), in the same
run: what the gateway's own engine client (``agl_trainer.gateway.upstream``) would cost
if it were httpx. The load generator is that own client, so that it takes little of
the machine from the processes it measures.

    .venv/bin/python -m tests.benchmarks.bench_gateway [--requests 3000] [--concurrency 1 64] [--httpx]
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

from agl_trainer.gateway.upstream import ConnectionPool, Endpoint
from tests.conftest import free_port

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
def servers(tmp: str):
    """The fake engine and the gateway, each in its own process, on 127.0.0.1."""
    # the checkout first, then whatever the caller put on the path (a worktree's own packages)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
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
                "--token",
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
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


async def _load(
    base_url: str, path: str, body: dict, requests: int, concurrency: int, use_httpx: bool = False
) -> tuple[list[float], float]:
    """Send ``requests`` POSTs from ``concurrency`` clients; latencies in seconds and the wall time."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    pool = ConnectionPool(Endpoint.parse(base_url), headers=auth)
    http = httpx.AsyncClient(
        base_url=base_url,
        headers=auth,
        http1=True,
        http2=False,
        trust_env=False,
        timeout=httpx.Timeout(None, connect=5.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )
    payload = json.dumps(body).encode()
    latencies: list[float] = []
    left = requests
    dropped = 0

    async def one() -> tuple[int, bytes]:
        if use_httpx:
            resp = await http.post(path, content=payload, headers={"Content-Type": "application/json"})
            return resp.status_code, resp.content
        resp = await pool.request("POST", path, payload)
        return resp.status, await resp.read()

    async def client() -> None:
        nonlocal left, dropped
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            try:
                status, data = await one()
            except httpx.TransportError:  # httpx does not retry a keep-alive connection the engine closed
                dropped += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"{status}: {data[:300]!r}")

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await pool.close()
    await http.aclose()
    if dropped:
        print(f"{base_url}: {dropped} of {requests} requests failed with a transport error (httpx)")
    return latencies, wall


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def run_load(base_url: str, path: str, body: dict, requests: int, concurrency: int, use_httpx: bool = False) -> dict:
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    lat, wall = runner(_load(base_url, path, body, requests, concurrency, use_httpx))
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
    with_httpx: bool = False,
) -> list[dict]:
    """Warm both paths, then measure each concurrency level: the baseline first, then the measured path.

    With ``with_httpx``, the baseline is also measured with httpx (row ``httpx``).
    """
    via_path, via_body = via_path or path, via_body or body
    run_load(direct, path, body, 200, 8)
    run_load(via, via_path, via_body, 200, 8)
    if with_httpx:
        run_load(direct, path, body, 200, 8, use_httpx=True)
    rows = []
    for c in levels:
        base = run_load(direct, path, body, requests, c)
        measured = run_load(via, via_path, via_body, requests, c)
        row = {"label": label, "concurrency": c, "base": base, "gw": measured}
        if with_httpx:
            row["httpx"] = run_load(direct, path, body, requests, c, use_httpx=True)
        rows.append(row)
    return rows


def print_rows(rows: list[dict], base_name: str, via_name: str) -> None:
    print(
        f"{'requests':<22}{'clients':>8}  {'p50 ms':>16}  {'p99 ms':>16}  {'calls/s':>16}  {'added p50':>10}"
        f"  {'added p99':>10}"
    )
    for r in rows:
        b, g = r["base"], r["gw"]
        measured = [(base_name, b), (via_name, g)] + ([(f"{base_name} httpx", r["httpx"])] if "httpx" in r else [])
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
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        "engine, gateway and load generator in separate processes"
    )
    tmp = tempfile.mkdtemp(prefix="agl-bench-")
    try:
        with servers(tmp) as (direct, via, db):
            rows = compare(
                direct, via, "/chat/completions", BODY, args.requests, args.concurrency, "chat", with_httpx=args.httpx
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
    if args.httpx:
        print(
            "'direct httpx': the engine alone through httpx.AsyncClient; its 'added' is httpx's cost over the "
            "gateway's own client"
        )


if __name__ == "__main__":
    main()
