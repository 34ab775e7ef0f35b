"""The gateway of this checkout against another commit's, the two taking turns in one run.

Each round starts, for each checkout in turn (the order alternates from round to round), a
fresh fake engine (this checkout's ``tests/fake_engine.py``, the same for both) and a fresh
``agl gateway serve`` importing that checkout's sources, with a real SQLite store and a
rollout key secret; then it measures, with the hand-written load generator of
``raw_http.py``:

- **production traffic** (the gateway token, ``/v1/chat/completions``) at each concurrency
  level: the engine alone, then through the gateway; the added p50, calls/s, and the
  gateway process's CPU time per call (user + system, from ``/proc``), the figure least
  moved by other work on a shared host;
- **rollout traffic** (``--rollouts``): running rollouts, each called ``--calls-per-rollout``
  times one after the other with its own rollout key at ``/rollouts/{id}/v1``: the p50 of
  each rollout's first call (the gateway has never seen the rollout: the store is asked for
  it and for the key's attempt) against the p50 of its later calls.

Compare the two checkouts' figures within a round and across rounds (ratios, not absolute
figures: the host is shared).

    .venv/bin/python -m tests.benchmarks.bench_gateway_ab [--against 28dbf9d | --other CHECKOUT] \\
        [--rounds 3] [--requests 2000] [--concurrency 1 16 64] [--rollouts 300 --calls-per-rollout 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from tests.benchmarks.bench_gateway import BODY, TOKEN, _wait_ready
from tests.benchmarks.raw_http import ConnectionPool, Endpoint
from tests.benchmarks.store_beside import add_other_checkout, other_checkout
from tests.conftest import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
AGAINST = "28dbf9d"
"""The commit compared against by default: the gateway's and the LangChain handler's fastest (issue 46)."""
SOURCES = (
    "core/src",
    "trainer/src",
    "integrations/langchain/src",
    "integrations/autogen/src",
    "integrations/openai-agents/src",
    "integrations/otel/src",
    "plugins/verl/src",
    "plugins/apo/src",
    ".",
)


def pythonpath(checkout: Path) -> str:
    """The checkout's package sources, first on ``sys.path`` (what ``/work/wt/env.sh`` sets)."""
    return os.pathsep.join(str(checkout / part) for part in SOURCES)


def _environ(checkout: Path) -> dict[str, str]:
    """This environment less agl's variables, with ``checkout``'s sources and no plugins."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    return base | {"PYTHONPATH": pythonpath(checkout), "AGL_LOAD_PLUGINS": ""}


def _load() -> str:
    return Path("/proc/loadavg").read_text().strip()


def take_turns(checkouts: dict[str, Path], rounds: int, turn: Callable[[Path], dict]) -> list[tuple[int, str, dict]]:
    """``(round, name, turn(checkout))`` for each checkout once a round, the order swapped every other
    round (so a busy second of the host weighs on both alike); each turn printed as it ends, and the
    load when all have."""
    names = list(checkouts)
    turns = []
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            turns.append((rnd, name, turn(checkouts[name])))
            print(f"round {rnd} {name}: {json.dumps(turns[-1][2])}", flush=True)
    print(f"load at the end: {_load()}")
    return turns


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def servers(checkout: Path, tmp: str):
    """The fake engine (this checkout's) and ``checkout``'s gateway, no plugins loaded (an older
    checkout may not know a newer plugin's hooks): ``(engine_url, gateway_url, gateway_pid, secret)``."""
    secret = secrets.token_urlsafe(24)
    secret_file = Path(tmp) / "secret"
    secret_file.write_text(secret)
    eport, gport = free_port(), free_port()
    base = _environ(checkout)
    procs = []
    try:
        engine = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_engine", "--port", str(eport)],
            cwd=ROOT,
            env=_environ(ROOT),
        )
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
                "--rollout-key-secret-file",
                str(secret_file),
                "--max-in-flight",
                "100000",
            ],
            cwd=checkout,
            env=base | {"AGL_GATEWAY_TOKEN": TOKEN},  # the flag's name changed; the variable's did not
            stdout=subprocess.DEVNULL,
        )
        procs.append(gateway)
        _wait_ready(f"http://127.0.0.1:{gport}/v1/models", gateway)
        yield f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{gport}", gateway.pid, secret
    finally:
        for p in reversed(procs):
            stop_process(p, timeout_s=15)


async def _production(url: str, requests: int, concurrency: int) -> tuple[list[float], float]:
    pool = ConnectionPool(Endpoint.parse(url), headers={"Authorization": f"Bearer {TOKEN}"})
    payload = json.dumps(BODY).encode()
    latencies: list[float] = []
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            resp = await pool.request("POST", "/v1/chat/completions", payload)
            body = await resp.read()
            latencies.append(time.perf_counter() - t0)
            if resp.status != 200:
                raise RuntimeError(f"{resp.status}: {body[:300]!r}")

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await pool.close()
    return latencies, wall


async def _rollouts(url: str, keys: dict[str, str], calls: int) -> tuple[list[float], list[float]]:
    """Each rollout called ``calls`` times in a row with its key: ``(first-call latencies, later ones)``."""
    pool = ConnectionPool(Endpoint.parse(url))
    payload = json.dumps(BODY).encode()
    first: list[float] = []
    later: list[float] = []
    for rollout_id, key in keys.items():
        for i in range(calls):
            t0 = time.perf_counter()
            resp = await pool.request(
                "POST",
                f"/rollouts/{rollout_id}/v1/chat/completions",
                payload,
                headers={"Authorization": f"Bearer {key}"},
            )
            body = await resp.read()
            (later if i else first).append(time.perf_counter() - t0)
            if resp.status != 200:
                raise RuntimeError(f"{resp.status}: {body[:300]!r}")
    await pool.close()
    return first, later


def _run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


_MAKE_ROLLOUTS = """
import json, sys
from agl.credentials import RolloutKeys
from agl.schema import Rollout, Task
from agl.store.sqlite import SqliteStore

db, secret, count, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with SqliteStore(db) as store:
    store.add_tasks([Task(task_id=f"task-{tag}", input={"q": "x"})])
    store.enqueue([Rollout(rollout_id=f"ro-{tag}-{i}", task_id=f"task-{tag}") for i in range(count)])
    claimed = store.claim("bench-runner", limit=count)
    print(json.dumps({r.rollout_id: RolloutKeys(secret).mint(r.rollout_id, r.attempt) for r in claimed}))
"""


def running_rollouts(checkout: Path, db: str, secret: str, count: int, tag: str) -> dict[str, str]:
    """``count`` rollouts enqueued and claimed in the gateway's store: ``{rollout_id: key}``. Made by
    ``checkout``'s own store code (a fresh process), so each gateway reads a database of its version."""
    done = subprocess.run(
        [sys.executable, "-c", _MAKE_ROLLOUTS, db, secret, str(count), tag],
        cwd=checkout,
        env=_environ(checkout),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def one_turn(checkout: Path, args: argparse.Namespace) -> dict:
    """One checkout's figures, on fresh processes."""
    tmp = tempfile.mkdtemp(prefix="agl-bench-ab-")
    out: dict = {"levels": {}}
    try:
        with servers(checkout, tmp) as (engine, gateway, pid, secret):
            _run(_production(engine, 200, 8))
            _run(_production(gateway, 200, 8))
            for c in args.concurrency:
                direct, _ = _run(_production(engine, args.requests, c))
                cpu0 = cpu_s(pid)
                via, wall = _run(_production(gateway, args.requests, c))
                cpu = cpu_s(pid) - cpu0
                out["levels"][c] = {
                    "added_p50_ms": p50_ms(via) - p50_ms(direct),
                    "calls_s": len(via) / wall,
                    "cpu_ms_per_call": cpu / len(via) * 1e3,
                }
            if args.rollouts:
                _run(
                    _rollouts(
                        gateway, running_rollouts(checkout, f"{tmp}/agl.db", secret, 20, "warm"), args.calls_per_rollout
                    )
                )
                keys = running_rollouts(checkout, f"{tmp}/agl.db", secret, args.rollouts, "bench")
                first, later = _run(_rollouts(gateway, keys, args.calls_per_rollout))
                out["first_p50_ms"], out["later_p50_ms"] = p50_ms(first), p50_ms(later)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def report(turns: list[tuple[int, str, dict]], levels: list[int], names: list[str]) -> None:
    print(
        f"{'round':>5}  {'checkout':<10}"
        + "".join(f"{f'c={c} added p50 ms':>18}{'calls/s':>9}{'CPU ms':>8}" for c in levels),
        end="",
    )
    print(f"{'first p50':>11}{'later p50':>11}{'gap ms':>8}")
    for rnd, name, t in turns:
        print(f"{rnd:>5}  {name:<10}", end="")
        for c in levels:
            lv = t["levels"][c]
            print(f"{lv['added_p50_ms']:>18.3f}{lv['calls_s']:>9.0f}{lv['cpu_ms_per_call']:>8.3f}", end="")
        if "first_p50_ms" in t:
            print(f"{t['first_p50_ms']:>11.3f}{t['later_p50_ms']:>11.3f}{t['first_p50_ms'] - t['later_p50_ms']:>8.3f}")
        else:
            print()
    print("medians over the rounds, and this checkout / the other:")
    med = {n: {} for n in names}
    for n in names:
        mine = [t for _, name, t in turns if name == n]
        for c in levels:
            for key in ("added_p50_ms", "calls_s", "cpu_ms_per_call"):
                med[n][(c, key)] = statistics.median(t["levels"][c][key] for t in mine)
        if mine and "first_p50_ms" in mine[0]:
            med[n]["gap"] = statistics.median(t["first_p50_ms"] - t["later_p50_ms"] for t in mine)
    this, other = med[names[0]], med[names[1]]
    for c in levels:
        added, calls, cpu = ((this[(c, k)], other[(c, k)]) for k in ("added_p50_ms", "calls_s", "cpu_ms_per_call"))
        print(
            f"  c={c}: added p50 {added[0]:.3f} vs {added[1]:.3f} ms; calls/s {calls[0]:.0f} vs {calls[1]:.0f} "
            f"({calls[0] / calls[1]:.2f}x); CPU per call {cpu[0]:.3f} vs {cpu[1]:.3f} ms ({cpu[0] / cpu[1]:.2f}x)"
        )
    if "gap" in med[names[0]]:
        print(f"  first call minus later calls, p50: {med[names[0]]['gap']:.3f} vs {med[names[1]]['gap']:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_other_checkout(parser, AGAINST)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rollouts", type=int, default=300, help="rollouts of the rollout traffic (0: none)")
    parser.add_argument("--calls-per-rollout", type=int, default=4)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        other = other_checkout(args, stack)
        run(ROOT, other, args)


def run(this: Path, other: Path, args: argparse.Namespace) -> None:
    """Every round's turns, then the table."""
    checkouts = {"this": this, "other": other}
    names = list(checkouts)
    print(f"this: {this}; other: {checkouts['other']}; {os.cpu_count()} cores; load {_load()}")
    turns = []
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            turns.append((rnd, name, one_turn(checkouts[name], args)))
            print(f"round {rnd} {name}: {json.dumps(turns[-1])}", flush=True)
    print(f"load at the end: {_load()}")
    report(turns, args.concurrency, names)


if __name__ == "__main__":
    main()
