"""Mixed adapters in one batch against one merged adapter: generated tokens per second of the
transformers engine on SmolLM2-135M-Instruct, in the same run.

* ``merged``: an engine serving adapter a merged into the weights (one policy: today's path);
* ``mixed, one adapter``: an engine in mixed mode (a as the default policy, b as policy
  ``writer``), every row on a: what serving the adapter unmerged costs;
* ``mixed, two adapters``: the same engine, half the rows on a and half on b, decoded together.

Rows go straight to the batcher (no HTTP): ``--rows`` rows of a ``--prompt``-token prompt, each
decoding ``--tokens`` tokens greedily; the best of ``--repeats`` runs counts.

    .venv/bin/python -m tests.benchmarks.bench_multi_adapter [--rows 8] [--tokens 64]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path


def make_adapter(model_dir, path: Path, seed: int) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(path)
    return str(path)


def tokens_per_second(engine, models: list[str | None], prompt: list[int], tokens: int, repeats: int) -> float:
    """Best generated tokens/s over ``repeats`` runs of one row per entry of ``models``."""
    from agl_verl.engines.batching import SamplingParams, Sequence

    best = 0.0
    for _ in range(repeats):
        rows = [
            Sequence(
                prompt_ids=prompt,
                params=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
                model_name=model,
            )
            for model in models
        ]
        started = time.perf_counter()
        engine.batchers[0].submit(rows).result(timeout=600)
        elapsed = time.perf_counter() - started
        best = max(best, sum(len(row.token_ids) for row in rows) / elapsed)
    return best


def main() -> None:
    from agl.schema import ModelVersion
    from agl_verl.engines.transformers_engine import TransformersEngine
    from agl_verl.models import smollm2_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model_dir = smollm2_dir()
    root = Path(tempfile.mkdtemp(prefix="agl-bench-adapters-"))
    a, b = make_adapter(model_dir, root / "a", 1), make_adapter(model_dir, root / "b", 2)
    prompt = [random.Random(0).randrange(1000, 40000) for _ in range(args.prompt)]
    options = {"max_batch_size": args.rows, "prefix_cache_mb": 0, "batch_wait_ms": 50}
    figures = {}
    with TransformersEngine(model_dir, **options) as merged:
        merged.load_version(ModelVersion(version="a", path=a))
        figures["merged"] = tokens_per_second(merged, [None] * args.rows, prompt, args.tokens, args.repeats)
    with TransformersEngine(model_dir, **options) as mixed:
        mixed.load_version(ModelVersion(version="a", path=a))
        mixed.load_version(ModelVersion(version="b", path=b, policy="writer"))
        one = [None] * args.rows
        two = [None, "writer"] * (args.rows // 2)
        figures["mixed, one adapter"] = tokens_per_second(mixed, one, prompt, args.tokens, args.repeats)
        figures["mixed, two adapters"] = tokens_per_second(mixed, two, prompt, args.tokens, args.repeats)
        assert mixed.adapters.mixed_passes > 0
    print(f"SmolLM2-135M-Instruct, LoRA r=16 all-linear, {args.rows} rows, {args.prompt}-token prompt, ", end="")
    print(f"{args.tokens} tokens each, best of {args.repeats}:")
    for name, value in figures.items():
        print(f"  {name:<22} {value:8.1f} generated tokens/s  ({value / figures['merged']:.2f}x merged)")


if __name__ == "__main__":
    main()
