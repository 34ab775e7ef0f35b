"""Evaluate the base model, or a trained LoRA adapter, on a split (greedy, one run per question).

    python -m examples.sql_agent.evaluate [--checkpoint DIR] [--split test|val|train] [--limit N] [--out FILE]

``--checkpoint`` is an adapter directory (``<workdir>/verl/versions/step-N``) or a
training work directory (its latest published version is used; a ``per-role`` run is served
as it trained, the writer on its last adapter and the checker on the base). Prints success per
tier, rewrite rounds, the checker's acceptance rate and LLM calls per agent.
"""

from examples.evaluation import evaluate_command
from examples.sql_agent.spec import SPEC

main = evaluate_command(SPEC, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
