"""agl-langchain's own part of a chat-model call against another checkout's: the two callbacks alone.

``bench_langchain_ab`` times whole calls, where LangChain's dispatch to a handler (about 30 µs
here) is the larger part and the same for both checkouts. This times only what agl adds on the
agent's thread: ``on_chat_model_start`` and ``on_llm_end`` called in a loop on the arguments
LangChain passed them for one call of ``GenericFakeChatModel`` (a system and a user message in,
one message out; a fresh run id each time), inside a rollout. Two writers: one that drops what it
is given (the callbacks' own work) and a real ``BufferedWriter`` into a real SQLite store (with
what holding the spans until they are written costs). Thread CPU time, so a host busy with other
work weighs less; each figure is the median of ``--blocks`` blocks of ``--calls`` calls, in fresh
processes taking turns (the order alternating from round to round).

    .venv/bin/python -m tests.benchmarks.bench_langchain_callbacks [--against 28dbf9d | --other CHECKOUT] \\
        [--rounds 3] [--calls 5000] [--blocks 9]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

from tests.benchmarks.bench_gateway_ab import _load, take_turns
from tests.benchmarks.bench_langchain_ab import AGAINST, ROOT, child_figures
from tests.benchmarks.store_beside import add_other_checkout, other_checkout

_LOOP = """
import itertools, json, statistics, sys, time, uuid
from pathlib import Path
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
import agl
from agl.capture import BufferedWriter
from agl.store.sqlite import SqliteStore
from agl_langchain import AglCallbackHandler

PROMPT = [SystemMessage("You are a careful assistant."), HumanMessage("What is 2 + 3? Answer briefly.")]
model = GenericFakeChatModel(messages=itertools.cycle([AIMessage("5")]))

class Recorder(BaseCallbackHandler):
    run_inline = True
    def on_chat_model_start(self, *args, **kwargs):
        self.start = (args, kwargs)
    def on_llm_end(self, *args, **kwargs):
        self.end = (args, kwargs)

class Drop:
    def put(self, item):
        pass

recorder = Recorder()
model.invoke(PROMPT, {"callbacks": [recorder]})
(start_args, start_kwargs), (end_args, end_kwargs) = recorder.start, recorder.end
calls, blocks = int(sys.argv[1]), int(sys.argv[2])
writer = BufferedWriter(SqliteStore(Path(sys.argv[3])))
handlers = {"drop": AglCallbackHandler(writer=Drop()), "sqlite": AglCallbackHandler(), "none": None}
cpu = {name: [] for name in handlers}
ids = [uuid.uuid4() for _ in range(calls)]
with agl.use_rollout(agl.RolloutContext(rollout_id="ro-bench", writer=writer)):
    for _ in range(blocks):
        for name, handler in handlers.items():
            t0 = time.thread_time_ns()
            for run_id in ids:
                start_kwargs["run_id"] = end_kwargs["run_id"] = run_id
                if handler is not None:
                    handler.on_chat_model_start(*start_args, **start_kwargs)
                    handler.on_llm_end(*end_args, **end_kwargs)
            cpu[name].append((time.thread_time_ns() - t0) / calls / 1000.0)
        writer.flush()
loop = statistics.median(cpu["none"])
errors = sum(h.errors for h in handlers.values() if h is not None)
print(json.dumps({**{f"{n}_us": statistics.median(v) - loop for n, v in cpu.items() if n != "none"}, "errors": errors}))
"""


def one_turn(checkout: Path, args: argparse.Namespace) -> dict:
    """One checkout's figures, from a fresh process (its store in the process's own temporary directory)."""
    out = child_figures(checkout, _LOOP, [str(args.calls), str(args.blocks), "bench.db"])
    if out["errors"]:
        raise RuntimeError(f"{checkout}: the handler swallowed {out['errors']} internal errors")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_other_checkout(parser, AGAINST)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000, help="calls in each timed block")
    parser.add_argument("--blocks", type=int, default=9, help="timed blocks of each writer in each turn")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        other = other_checkout(args, stack)
        checkouts = {"this": ROOT, "other": other}
        print(f"this: {ROOT}; other: {other}; load {_load()}")
        turns = take_turns(checkouts, args.rounds, lambda checkout: one_turn(checkout, args))
    print(f"{'round':>5}  {'checkout':<8}{'drop us':>10}{'sqlite us':>11}")
    for rnd, name, t in turns:
        print(f"{rnd:>5}  {name:<8}{t['drop_us']:>10.2f}{t['sqlite_us']:>11.2f}")
    for key in ("drop_us", "sqlite_us"):
        med = {n: statistics.median(t[key] for _, name, t in turns if name == n) for n in checkouts}
        print(f"median {key}: this {med['this']:.2f} vs other {med['other']:.2f} ({med['this'] / med['other']:.2f}x)")


if __name__ == "__main__":
    main()
