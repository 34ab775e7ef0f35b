"""The gateway's CPU per request in-process, this checkout against another, taking turns in one run.

Where :mod:`tests.benchmarks.bench_gateway_ab` measures whole processes over sockets, this one
leaves out the network, the HTTP server and the engine, to see the gateway's own work: each
turn starts a fresh process (:mod:`tests.benchmarks.gateway_inproc_child`, run with that
checkout's sources first on ``PYTHONPATH``) that starts the checkout's real ``Gateway`` over a
real SQLite store and calls its ASGI app on the gateway's own event loop, ``--concurrency``
requests at a time (the request of :mod:`tests.benchmarks.bench_gateway`, production token,
``/v1/chat/completions``). The engine is the one stand-in: each replica's connection pool is
replaced by a canned engine that answers :func:`engine_answer` (the fake engine's answer to
that request, token ids and logprobs included), so it costs nothing and is not measured.

After a warm-up of ``--warmup`` requests, each of ``--repeats`` runs of ``--requests``
requests gives the process's CPU time per request (all threads, the store writer's share
included: the store is flushed before the clock stops) and the event loop thread's alone, in
microseconds. The checkouts take turns over ``--rounds`` (the order swapped each round), so a
busy spell on a shared host slows both alike; printed: every turn's median, then each
checkout's median over all its runs and the ratio this / other.

Measured 2026-11-29 on the shared 2-core host (load average 11.1-13.0, training runs alongside),
``--other`` a worktree of 28dbf9d, the defaults (3 rounds, 5 runs of 3,000 requests a turn, 16 at
once): process CPU per request 182.3 against 176.8 us (1.03x), the loop thread's 144.6 against
139.5 us (1.04x); single turns' medians moved 172-194 us.

    .venv/bin/python -m tests.benchmarks.bench_gateway_inproc [--against 28dbf9d | --other CHECKOUT] \\
        [--rounds 3] [--requests 3000] [--concurrency 16] [--repeats 5] [--warmup 500]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.benchmarks.bench_gateway import BODY, TOKEN
from tests.benchmarks.bench_gateway_ab import AGAINST, ROOT, _environ, _load, take_turns
from tests.benchmarks.store_beside import add_other_checkout, other_checkout

CHILD = Path(__file__).with_name("gateway_inproc_child.py")
MODEL = "fake-policy"


def _token_logprob(token: int) -> float:
    return -0.1 - (token % 10) / 100  # the fake engine's rule (tests/fake_engine.py)


def engine_answer() -> dict:
    """The engine's answer to ``BODY`` (vLLM's dialect, as ``tests/fake_engine.py`` gives it): the
    prompt's ids are the bytes of its rendering, the answer echoes the question."""
    prompt = "<system>You are a helpful assistant.</s><user>What is the capital of France?</s><assistant>"
    text = "echo: What is the capital of France?"
    prompt_ids, ids = list(prompt.encode()), list((text + "</s>").encode())
    logprobs = [{"token": chr(t), "logprob": _token_logprob(t), "bytes": [t], "top_logprobs": []} for t in ids]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
        "stop_reason": None,
        "logprobs": {"content": logprobs},
        "token_ids": ids,
    }
    return {
        "id": "chatcmpl-canned",
        "object": "chat.completion",
        "created": 1795957395,
        "model": MODEL,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        },
        "prompt_token_ids": prompt_ids,
    }


def models_answer() -> dict:
    """The engine's ``GET /models``: the model it serves."""
    return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake", "max_model_len": 8192}]}


def one_turn(checkout: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    """A fresh process of ``checkout`` measured: ``{"process_us": [...], "loop_thread_us": [...]}``."""
    settings = {
        "body": json.dumps(BODY),
        "answer": json.dumps(engine_answer()),
        "models": json.dumps(models_answer()),
        "token": TOKEN,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "warmup": args.warmup,
    }
    with tempfile.TemporaryDirectory(prefix="agl-bench-inproc-") as cwd:  # not the checkout: nothing shadows
        done = subprocess.run(
            [sys.executable, "-P", str(CHILD)],  # -P: the script's folder is not put on sys.path
            input=json.dumps(settings),
            cwd=cwd,
            env=_environ(checkout),
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(figures.pop("gateway")).is_relative_to(checkout):
        raise SystemExit(f"{checkout}: the child imported another checkout's gateway")
    return figures


def report(turns: list[tuple[int, str, dict[str, list[float]]]], names: list[str]) -> None:
    """Each turn's medians, then each checkout's median over all its runs, and the ratio."""
    print(f"{'round':>5}  {'checkout':<8}{'process CPU us/request':>24}{'loop thread us/request':>24}")
    for rnd, name, t in turns:
        process, thread = statistics.median(t["process_us"]), statistics.median(t["loop_thread_us"])
        print(f"{rnd:>5}  {name:<8}{process:>24.1f}{thread:>24.1f}")
    print("medians over every run, and this / other:")
    for key, label in (("process_us", "process CPU"), ("loop_thread_us", "loop thread CPU")):
        med = {n: statistics.median(v for _, name, t in turns if name == n for v in t[key]) for n in names}
        runs = sum(len(t[key]) for _, name, t in turns if name == names[0])
        print(
            f"  {label} per request: {med[names[0]]:.1f} vs {med[names[1]]:.1f} us "
            f"({med[names[0]] / med[names[1]]:.2f}x, {runs} runs each)"
        )


def run(this: Path, other: Path, args: argparse.Namespace) -> None:
    """Every round's turns, then the table."""
    checkouts = {"this": this, "other": other}
    names = list(checkouts)
    print(f"this: {this}; other: {other}; {os.cpu_count()} cores; load {_load()}")
    print(f"{args.requests} requests x {args.repeats} a turn, {args.concurrency} at once, after {args.warmup}")
    turns = take_turns(checkouts, args.rounds, lambda checkout: one_turn(checkout, args))
    report(turns, names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_other_checkout(parser, AGAINST)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000, help="requests a run")
    parser.add_argument("--concurrency", type=int, default=16, help="requests at once")
    parser.add_argument("--repeats", type=int, default=5, help="runs a turn")
    parser.add_argument("--warmup", type=int, default=500, help="requests before the first run")
    args = parser.parse_args()
    for name in ("rounds", "requests", "concurrency", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1, got {getattr(args, name)}")
    with contextlib.ExitStack() as stack:
        other = other_checkout(args, stack)
        run(ROOT, other, args)


if __name__ == "__main__":
    main()
