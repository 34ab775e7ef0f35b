"""Evaluate the base model, or a trained LoRA adapter, on a split (greedy, one run per question).

    python -m examples.rag_agent.evaluate [--checkpoint DIR] [--split test|val|train] [--limit N] [--out FILE]
    python -m examples.rag_agent.evaluate --split val --temperature 1 --samples 4 [--hops 1]

``--checkpoint`` is an adapter directory (``<workdir>/verl/versions/step-N``) or a
training work directory (its latest published version is used). Prints token F1 and
exact match (overall and by hops), how episodes ended, tool calls per episode and the
tool-call validity rate. ``--samples K`` at a ``--temperature`` runs each question K
times and adds the fraction of questions whose samples' F1 differ: those a GRPO group of
K would learn from.
"""

from examples.evaluation import evaluate_command
from examples.rag_agent.spec import SPEC

main = evaluate_command(SPEC, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
