"""The transformers engine's CPU seconds per generated token, on an idle machine and a busy one.

    .venv/bin/python -m tests.benchmarks.bench_engine_cpu [--case serve beside] [--policy passive default]
        [--load idle bursts cores] [--requests 16] [--prompt-tokens 300] [--tokens 40] [--budget 120]

What runs (SmolLM2-135M-Instruct, ``agl_verl.models.smollm2_dir()``, fp32, torch's default thread count):

* ``--case serve``: ``agl engine serve --preset smollm2`` alone, as a subprocess.
* ``--case beside``: one process that holds agl_verl's local learner (the examples' LoRA
  adapter; one real update runs first, so its OpenMP team exists) and a TransformersEngine,
  as local training has them.

Each with ``--policy passive`` (agl_verl as it is: ``OMP_WAIT_POLICY=PASSIVE``, set when
agl_verl is imported) and the same-run baseline ``--policy default``: the old behaviour,
OMP_WAIT_POLICY unset when libgomp loads (the process imports torch before agl_verl, so
agl_verl cannot set it; it warns). ``--policy spin10k`` (``GOMP_SPINCOUNT=10000``, a
middle ground) can be added. Under each ``--load``: ``idle`` (nothing else runs),
``bursts`` (four neighbour processes that each alternate 10 ms of CPU work and 10 ms of
sleep, like an agent's tool servers) and ``cores`` (one neighbour per core that never
sleeps).

The request set: ``--requests`` completions sent at once over loopback HTTP with a bearer
token, each a ``--prompt-tokens`` token-id prefix shared by all plus 8 ids of its own,
``--tokens`` sampled tokens with ``ignore_eos``, streamed so that tokens are counted as they
come. A run stops at ``--budget`` seconds and is marked cut (its figures then cover the
tokens so far, and overstate CPU per token: the prefill comes first). The
engine's CPU time is its process's utime+stime from /proc (every thread, OpenMP workers
included), taken just before the requests and when the last token arrives. Printed: tokens,
wall seconds, tokens/s, CPU ms per token, and per case and policy the ratio of busy to idle
CPU per token (issue 34's bar: at most 1.2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")

POLICIES = {
    "passive": ("", {}),
    "default": ("import torch\n", {}),
    "spin10k": ("", {"GOMP_SPINCOUNT": "10000"}),
}
"""Per policy: what the engine process runs first, and the variables it starts with."""

NEIGHBOURS = {
    "idle": (0, ""),
    "bursts": (
        4,
        "import time\nwhile True:\n    end = time.perf_counter() + 0.01\n"
        "    while time.perf_counter() < end: pass\n    time.sleep(0.01)\n",
    ),
    "cores": (os.cpu_count() or 1, "while True: pass\n"),
}
"""Per load: how many neighbour processes, and what each runs."""

SERVE = "import sys\nfrom agl_trainer.cli import main\nsys.argv[0] = 'agl'\nsys.exit(main())\n"
BESIDE = "import sys\nfrom tests.benchmarks.bench_engine_cpu import beside\nbeside(int(sys.argv[1]), sys.argv[2])\n"
TOKEN = "bench-engine-cpu-token"


def beside(port: int, token: str) -> None:
    """The ``beside`` engine process: a local learner after one update, and an engine; serves until stdin closes."""
    import tempfile

    from agl.schema import Transition
    from agl_verl.engines.transformers_engine import TransformersEngine
    from agl_verl.models import smollm2_dir
    from tests.benchmarks.smollm2_learner import lora_backend, smollm2_vocab

    model_dir = smollm2_dir()
    rng = random.Random(0)
    vocab = smollm2_vocab(model_dir)
    prompts = [rng.choices(vocab, k=64) for _ in range(2)]
    batch = [
        Transition(
            rollout_id=f"r{i}",
            task_id=f"t{i // 4}",
            step=0,
            prompt_ids=prompts[i // 4],
            response_ids=rng.choices(vocab, k=32),
            response_logprobs=[-3.0] * 32,
            reward=float(i % 2),
        )
        for i in range(8)
    ]
    with tempfile.TemporaryDirectory() as workdir:
        backend = lora_backend(model_dir, workdir, micro=8)
        backend.train_step(batch, 0)  # the learner's OpenMP team exists from here on
        engine = TransformersEngine(model_dir, api_key=token, port=port)
        engine.start()
        print("ready", flush=True)
        sys.stdin.read()
        engine.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid``, all its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def engine_process(case: str, policy: str):
    """The engine of ``case`` under ``policy``, started and ready; yields (process, base URL)."""
    prelude, extra = POLICIES[policy]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra)
    port = free_port()
    if case == "serve":
        args = [SERVE, "engine", "serve", "--preset", "smollm2", "--port", str(port), "--engine-token", TOKEN]
    else:
        args = [BESIDE, str(port), TOKEN]
    proc = subprocess.Popen(
        [sys.executable, "-c", prelude + args[0], *args[1:]],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(proc, url)
        yield proc, url
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        warned = "ThreadPolicyWarning" in err
        print(f"  ({case}/{policy}: the engine {'warned' if warned else 'did not warn'} about the wait policy)")


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the engine at {url} was not ready in {timeout_s:.0f}s")


def request_bodies(args: argparse.Namespace, vocab_size: int = 49152) -> list[dict]:
    """The fixed request set: a shared token-id prefix, a few ids of each request's own."""
    rng = random.Random(34)
    shared = [rng.randrange(100, vocab_size) for _ in range(args.prompt_tokens)]
    return [
        {
            "model": "smollm2",
            "prompt": shared + [rng.randrange(100, vocab_size) for _ in range(8)],
            "max_tokens": args.tokens,
            "temperature": 1.0,
            "seed": i,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream": True,
        }
        for i in range(args.requests)
    ]


async def stream_tokens(client: httpx.AsyncClient, body: dict, counts: list[int], last: list[float]) -> None:
    async with client.stream("POST", "/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    counts[0] += len(choice.get("token_ids") or [])
                last[0] = time.perf_counter()


async def measure(pid: int, url: str, bodies: list[dict], budget_s: float) -> dict:
    """Send ``bodies`` at once; tokens, seconds and the engine's CPU seconds until the last token (or the budget)."""
    counts, last = [0], [0.0]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=budget_s + 60) as client:
        cpu0, started = cpu_seconds(pid), time.perf_counter()
        tasks = [asyncio.ensure_future(stream_tokens(client, body, counts, last)) for body in bodies]
        done, pending = await asyncio.wait(tasks, timeout=budget_s)
        cpu1 = cpu_seconds(pid)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()
    end = last[0] if not pending else started + budget_s
    return {"tokens": counts[0], "wall": end - started, "cpu": cpu1 - cpu0, "cut": bool(pending)}


@contextlib.contextmanager
def neighbours(load: str):
    count, code = NEIGHBOURS[load]
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    try:
        time.sleep(0.5 if procs else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_case(case: str, policy: str, args: argparse.Namespace, bodies: list[dict]) -> dict[str, dict]:
    """Every ``--load`` against one engine of ``case`` under ``policy``."""
    results = {}
    with engine_process(case, policy) as (proc, url):
        warm = [dict(bodies[0], max_tokens=4, seed=999)]
        asyncio.run(measure(proc.pid, url, warm, args.budget))
        for load in args.load:
            with neighbours(load):
                r = asyncio.run(measure(proc.pid, url, bodies, args.budget))
            results[load] = r
            ms = 1000 * r["cpu"] / max(r["tokens"], 1)
            print(
                f"{case:7s} {policy:8s} {load:7s} {r['tokens']:6d} {r['wall']:7.1f} "
                f"{r['tokens'] / r['wall']:6.1f} {r['cpu']:7.1f} {ms:8.1f}{'  (cut at --budget)' if r['cut'] else ''}",
                flush=True,
            )
            if r["cut"]:
                time.sleep(5)  # the cancelled rows leave the batch before the next load
    return results


def print_ratios(all_results: dict[tuple[str, str], dict[str, dict]]) -> None:
    print("\nCPU per generated token, busy / idle (bar: <= 1.2); tokens/s, busy / idle")
    for (case, policy), results in all_results.items():
        if "idle" not in results:
            continue
        idle = results["idle"]
        for load, r in results.items():
            if load == "idle" or not r["tokens"] or not idle["tokens"]:
                continue
            cpu = (r["cpu"] / r["tokens"]) / (idle["cpu"] / idle["tokens"])
            speed = (r["tokens"] / r["wall"]) / (idle["tokens"] / idle["wall"])
            verdict = "ok" if cpu <= 1.2 else "over the bar"
            print(f"{case:7s} {policy:8s} {load:7s} cpu x{cpu:5.2f} ({verdict})   tokens/s x{speed:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", nargs="+", choices=("serve", "beside"), default=["serve", "beside"])
    parser.add_argument("--policy", nargs="+", choices=tuple(POLICIES), default=["passive", "default"])
    parser.add_argument("--load", nargs="+", choices=tuple(NEIGHBOURS), default=["idle", "bursts", "cores"])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds one load may take (default 120)")
    args = parser.parse_args()
    bodies = request_bodies(args)
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.requests} requests of "
        f"{args.prompt_tokens}+8 prompt tokens, {args.tokens} tokens each"
    )
    columns = ("tokens", 6), ("wall_s", 7), ("tok/s", 6), ("cpu_s", 7), ("cpu_ms/tok", 8)
    print(f"{'case':7s} {'policy':8s} {'load':7s} " + " ".join(f"{name:>{width}s}" for name, width in columns))
    all_results = {}
    for case in args.case:
        for policy in args.policy:
            try:
                all_results[(case, policy)] = run_case(case, policy, args, bodies)
            except (RuntimeError, httpx.HTTPError, OSError, subprocess.SubprocessError) as exc:
                print(f"{case} {policy}: failed: {exc}", flush=True)
    print_ratios(all_results)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
