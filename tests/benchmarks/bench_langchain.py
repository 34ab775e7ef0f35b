"""What AglCallbackHandler adds to each LLM call, and what memory it holds over many calls.

Run: ``.venv/bin/python -m tests.benchmarks.bench_langchain [--calls 10000] [--memory-calls 100000]``

The agent is one chat-model call (system + user message) of langchain-core's
``GenericFakeChatModel``, invoked ``--calls`` times in each of three set-ups, in
interleaved blocks so drift hits all alike:

- baseline: no handler;
- handler: ``config={"callbacks": [AglCallbackHandler()]}``;
- zero-line: ``agl_langchain.instrument()``, no callbacks passed;
- no-op handler: a ``BaseCallbackHandler`` that does nothing (``run_inline``), the
  floor LangChain's own callback dispatch costs any handler.

Spans go through a real BufferedWriter into a real SqliteStore (in a temporary
directory). Then ``--memory-calls`` calls with the handler, reporting resident
memory along the way: bounded means it stops growing once the writer's buffer
flushes at its batch size.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

import agl
import agl_langchain
from agl.capture import BufferedWriter
from agl.store.sqlite import SqliteStore
from agl_langchain import AglCallbackHandler

PROMPT = [SystemMessage("You are a careful assistant."), HumanMessage("What is 2 + 3? Answer briefly.")]
BLOCK = 500


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MB, from /proc."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


class NoopHandler(BaseCallbackHandler):
    """A handler that records nothing: what any handler costs inside LangChain."""

    run_inline = True


def new_model() -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=itertools.cycle([AIMessage("5")]))


def timed_block(model, n: int, config: dict | None, out: list[float]) -> None:
    invoke = model.invoke
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        invoke(PROMPT, config)
        out.append((clock() - t0) / 1000.0)


def summary(name: str, samples: list[float], base: list[float] | None) -> str:
    p50 = statistics.median(samples)
    mean = statistics.fmean(samples)
    line = f"{name:<22} p50 {p50:8.1f} µs   mean {mean:8.1f} µs"
    if base is not None:
        line += f"   added p50 {p50 - statistics.median(base):+7.1f} µs"
        line += f"   added mean {mean - statistics.fmean(base):+7.1f} µs"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--memory-calls", type=int, default=100_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        writer = BufferedWriter(store)
        ctx = agl.RolloutContext(rollout_id="ro-bench", writer=writer)
        model = new_model()
        handler = AglCallbackHandler()
        with_handler = {"callbacks": [handler]}
        base: list[float] = []
        explicit: list[float] = []
        zero: list[float] = []
        noop: list[float] = []
        with_noop = {"callbacks": [NoopHandler()]}
        with agl.use_rollout(ctx):
            for cfg in (None, with_handler):  # warm-up: imports, caches, first store writes
                timed_block(model, 200, cfg, [])
            for _ in range(max(1, args.calls // BLOCK)):
                timed_block(model, BLOCK, None, base)
                timed_block(model, BLOCK, with_handler, explicit)
                agl_langchain.instrument(handler)
                timed_block(model, BLOCK, None, zero)
                agl_langchain.uninstrument()
                timed_block(model, BLOCK, with_noop, noop)
            writer.flush()
            recorded = sum(1 for _ in store.query_spans(rollout_id="ro-bench", kind="llm"))

        print(f"agl-langchain overhead: {len(base)} calls per set-up of a fake chat model, one span per call")
        print(summary("baseline (no handler)", base, None))
        print(summary("AglCallbackHandler", explicit, base))
        print(summary("zero-line instrument()", zero, base))
        print(summary("no-op handler (floor)", noop, base))
        print(
            f"spans stored: {recorded} (expected {len(explicit) + len(zero) + 200}); handler errors: {handler.errors}"
        )

        n = args.memory_calls
        if n:
            mem_ctx = agl.RolloutContext(rollout_id="ro-mem", writer=writer)
            checkpoints = {n // 10, n // 2, n}
            print(f"\nmemory over {n} calls with the handler (spans flushed to SQLite as they come):")
            rss0, _ = rss_mb()
            print(f"  before        rss {rss0:7.1f} MB")
            t0 = time.perf_counter()
            with agl.use_rollout(mem_ctx):
                for i in range(1, n + 1):
                    model.invoke(PROMPT, with_handler)
                    if i in checkpoints:
                        rss, peak = rss_mb()
                        print(
                            f"  after {i:>7} rss {rss:7.1f} MB  peak {peak:7.1f} MB  "
                            f"buffered {writer.pending():>6}  open runs {handler.open_runs()}"
                        )
            elapsed = time.perf_counter() - t0
            writer.flush()
            stored = store.stats().spans
            print(
                f"  {n / elapsed:,.0f} calls/s; store holds {stored} spans; writer wrote {writer.written}, "
                f"write errors {writer.write_errors}"
            )
        writer.close()
        store.close()


if __name__ == "__main__":
    main()
