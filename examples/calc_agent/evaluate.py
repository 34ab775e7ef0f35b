"""Evaluate the base model, or a trained LoRA adapter, on a split (greedy, one run per problem).

    python -m examples.calc_agent.evaluate [--checkpoint DIR] [--split test|val|train] [--limit N] [--out FILE]
    python -m examples.calc_agent.evaluate --split val --operations 2 --temperature 1 --samples 4

``--checkpoint`` is an adapter directory (``<workdir>/verl/versions/step-N``) or a
training work directory (its latest published version is used). Prints the success
rate (overall and by number of operations), the tool-call validity rate and its
breakdown, tool calls per episode and LLM calls per episode. ``--samples K`` at a
``--temperature`` runs each problem K times and adds the fraction of problems with at
least one success: what a GRPO group of K would learn from.
"""

from examples.calc_agent.spec import SPEC
from examples.evaluation import evaluate_command

main = evaluate_command(SPEC, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
