"""Transformers engine throughput on SmolLM2-135M-Instruct: dynamic batching versus one at a time.

    .venv/bin/python -m tests.benchmarks.bench_engine [--tokens 32] [--concurrency 1 8 32]

For each concurrency level, that many chat requests (``max_tokens`` sampled tokens each,
``ignore_eos``) are sent at once to an engine with ``max_batch_size=32`` and to the
baseline, the same engine with ``max_batch_size=1`` (requests decoded one at a time), in
the same run. Prints generated tokens per second for both and the speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def run_level(url: str, concurrency: int, tokens: int) -> tuple[float, int]:
    body = {
        "model": "smollm2",
        "max_tokens": tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(i: int) -> int:
            messages = [{"role": "user", "content": f"Tell me a short fact about the number {i}."}]
            response = await client.post("/chat/completions", json={**body, "messages": messages, "seed": i})
            response.raise_for_status()
            return len(response.json()["choices"][0]["token_ids"])

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(concurrency)))
        return time.perf_counter() - started, sum(counts)


def measure(model_dir, max_batch_size: int, levels: list[int], tokens: int) -> dict[int, tuple[float, int]]:
    from agl_verl.engines.transformers_engine import TransformersEngine

    with TransformersEngine(model_dir, max_batch_size=max_batch_size) as engine:
        url = engine.urls[0]
        asyncio.run(run_level(url, 1, 4))  # warm-up
        results = {}
        for level in levels:
            results[level] = elapsed, count = asyncio.run(run_level(url, level, tokens))
            print(
                f"  max_batch_size={max_batch_size:<2} concurrent={level:<3} {count / elapsed:7.1f} tok/s", flush=True
            )
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    import torch

    from agl_verl.models import smollm2_dir

    model_dir = smollm2_dir()
    print(f"SmolLM2-135M-Instruct, fp32 CPU, {torch.get_num_threads()} torch threads, {args.tokens} tokens/request")
    batched = measure(model_dir, 32, args.concurrency, args.tokens)
    baseline = measure(model_dir, 1, args.concurrency, args.tokens)
    print(f"{'concurrent':>10} | {'batched tok/s':>13} | {'one-at-a-time tok/s':>19} | {'speed-up':>8}")
    for level in args.concurrency:
        (bt, bn), (st, sn) = batched[level], baseline[level]
        print(f"{level:>10} | {bn / bt:>13.1f} | {sn / st:>19.1f} | {(bn / bt) / (sn / st):>7.2f}x")


if __name__ == "__main__":
    main()
