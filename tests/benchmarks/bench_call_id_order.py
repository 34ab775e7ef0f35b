"""What the order of call ids costs the store writer: the gateway's ids against random ones, in turns.

Each turn writes ``--records`` records of the gateway benchmark's call (its request, the fake
engine's answer as the gateway records it, 91 prompt and 40 response ids with logprobs) into a
fresh SQLite store, ``--batch`` records an ``add_llm_calls`` (as the gateway's writer sends
them under load), and prints the CPU time a record in each quarter of the turn, the index on
``call_id`` growing as it goes. The ids are either :func:`~agl_trainer.gateway.call_ids.new_call_id`'s
(the time first: they sort in the order they are made) or ``chatcmpl-`` and 32 random hex digits
(as ``uuid4`` ids or a keyed hash alone are). The two kinds take turns for ``--rounds`` rounds;
printed: every turn, then each kind's median over all its quarters and the ratio.

    .venv/bin/python -m tests.benchmarks.bench_call_id_order [--rounds 3] [--records 12000] [--batch 16]

Figures (2026-11-29, the shared 2-core host, load average 4-6) are in
:mod:`agl_trainer.gateway.call_ids`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from agl.schema import LLMCall
from agl.store.sqlite import SqliteStore
from agl_trainer.gateway import chat
from agl_trainer.gateway.call_ids import new_call_id
from tests.benchmarks.bench_gateway import BODY
from tests.benchmarks.bench_gateway_ab import _load
from tests.benchmarks.bench_gateway_inproc import engine_answer

KINDS = {
    "ordered": lambda: new_call_id("chatcmpl-"),
    "random": lambda: "chatcmpl-" + os.urandom(16).hex(),
}


def records(ids: list[str]) -> list[LLMCall]:
    """The benchmark's call recorded once per id, as the gateway records it."""
    answer = engine_answer()
    prompt_ids, tokens = chat.take_chat_tokens(answer, keep_ids=False, keep_logprobs=False)
    return [
        LLMCall(
            call_id=call_id,
            seq=i,
            requested_model=BODY["model"],
            request=BODY,
            response=answer,
            prompt_ids=prompt_ids,
            response_ids=tokens[0].ids,
            response_logprobs=tokens[0].logprobs,
            latency_s=0.001,
        )
        for i, call_id in enumerate(ids)
    ]


def one_turn(kind: str, n: int, batch: int) -> list[float]:
    """CPU microseconds a record in each quarter of ``n`` records written with ``kind``'s ids."""
    calls = records([KINDS[kind]() for _ in range(n)])
    quarters = []
    with tempfile.TemporaryDirectory(prefix="agl-bench-ids-") as tmp, SqliteStore(str(Path(tmp) / "agl.db")) as store:
        for q in range(4):
            part = calls[q * n // 4 : (q + 1) * n // 4]
            t0 = time.process_time()
            for i in range(0, len(part), batch):
                store.add_llm_calls(part[i : i + batch])
            quarters.append((time.process_time() - t0) / len(part) * 1e6)
    return quarters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=12_000)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    for name in ("rounds", "records", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1, got {getattr(args, name)}")
    print(f"{args.records} records a turn, {args.batch} a write; load {_load()}")
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for rnd in range(args.rounds):
        for kind in list(KINDS) if rnd % 2 == 0 else list(KINDS)[::-1]:
            quarters = one_turn(kind, args.records, args.batch)
            runs[kind] += quarters
            print(f"round {rnd} {kind:<8} us a record, by quarter: " + " ".join(f"{q:6.1f}" for q in quarters))
    print(f"load at the end: {_load()}")
    ordered, shuffled = statistics.median(runs["ordered"]), statistics.median(runs["random"])
    print(f"median: ordered {ordered:.1f} vs random {shuffled:.1f} us a record ({ordered / shuffled:.2f}x)")


if __name__ == "__main__":
    main()
