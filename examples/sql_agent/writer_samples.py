"""How often the writer's first query is right, per sample, at a few temperatures.

The figure that decides whether GRPO has anything to learn from: a group of rollouts
whose rewards are all 0 carries no advantage. This samples the writer's first call
alone (no checker, no rewriter), with transformers' ``generate`` on the base model, and
scores each query by execution match. It is how the training temperature and the worked
examples were chosen, on validation (see docs/results/sql-agent.md):

    python -m examples.sql_agent.writer_samples --split val --tier easy --limit 16 --runs 0:1 0.5:8 1.0:8
    python -m examples.sql_agent.writer_samples ... --examples 1    # the first worked example only

``--runs T:N`` samples N answers per question at temperature T (0: greedy, one answer).
"""

from __future__ import annotations

import argparse
import sys
import time

from . import prompts
from .questions import TIERS, load_split, of_tiers
from .rewards import execution_match

ROLES = {"system": "system", "human": "user", "ai": "assistant"}


def chat(question: str, n_examples: int) -> list[dict[str, str]]:
    """The writer's messages with the first ``n_examples`` worked examples, as chat-template dicts."""
    messages = prompts.writer_messages(question)
    system, examples, asked = messages[0], messages[1:-1], messages[-1]
    return [{"role": ROLES[r], "content": c} for r, c in [system, *examples[: 2 * n_examples], asked]]


def score(answer: str, question: dict) -> float:
    """Execution match of the query in ``answer`` (cut at the closing fence, as the agent's stop does)."""
    sql = prompts.extract_sql(answer.split("\n```")[0])
    return execution_match(sql, question["gold_sql"], question["ordered"])


def sample(model, tokenizer, texts: list[str], temperature: float, n: int, max_tokens: int) -> list[list[str]]:
    """``n`` answers per prompt (greedy when ``temperature`` is 0)."""
    import torch

    answers: list[list[str]] = []
    for start in range(0, len(texts), 8):
        batch = tokenizer(texts[start : start + 8], return_tensors="pt", padding=True)
        options = {"do_sample": True, "temperature": temperature, "top_p": None, "top_k": None} if temperature else {}
        with torch.no_grad():
            out = model.generate(
                **batch,
                max_new_tokens=max_tokens,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id,
                **options,
            )
        decoded = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        answers += [decoded[i : i + n] for i in range(0, len(decoded), n)]
    return answers


def main(argv: list[str] | None = None) -> int:
    """Print the per-sample success and the share of questions with at least one right sample, per run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="val", choices=["train", "val"], help="never test: nothing is tuned on it")
    parser.add_argument("--tier", default="easy", choices=TIERS)
    parser.add_argument("--limit", type=int, default=16, help="the first N questions of the tier")
    parser.add_argument("--runs", nargs="+", default=["0:1", "0.5:8"], help="TEMPERATURE:SAMPLES, one per run")
    parser.add_argument("--examples", type=int, default=len(prompts.WRITER_EXAMPLES), help="worked examples shown")
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agl_verl.models import smollm2_dir

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir(), padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir()).eval()
    items = of_tiers(load_split(args.split), (args.tier,))[: args.limit]
    chats = [chat(t["input"]["question"], args.examples) for t in items]
    texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    prompt_tokens = len(tokenizer(texts[0])["input_ids"])
    for run in args.runs:
        temperature, n = float(run.split(":")[0]), int(run.split(":")[1])
        started = time.monotonic()
        answers = sample(model, tokenizer, texts, temperature, n, args.max_tokens)
        scores = [[score(a, t["input"]) for a in group] for t, group in zip(items, answers, strict=True)]
        per_sample = sum(map(sum, scores)) / sum(map(len, scores))
        with_success = sum(any(s) for s in scores) / len(scores)
        print(
            f"{args.split}/{args.tier}, {len(items)} questions, {args.examples} examples "
            f"({prompt_tokens} prompt tokens), T={temperature} x{n}: right per sample {per_sample:.3f}, "
            f"questions with a right sample {with_success:.2f} ({time.monotonic() - started:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
