"""Train the retrieval agent (agent.py) with reinforcement learning, one seed.

SmolLM2-135M-Instruct with a LoRA adapter, the transformers engine behind the agl
gateway, verl's GRPO advantages and PPO loss in the local backend, all in this
process. It trains on the one-hop questions (``--hops``). The test split, both hops, is
evaluated greedily after the last step; the base model's figures are evaluated once and
shared by every seed (``results/base/test.json``). Nothing is evaluated, selected or
tuned on test in between (``val_every: 0``). The figures go to
``results/<arm>-seed<N>.json``: the arm is ``rag_agent`` with the config's hops and
batch size, and names the others (``rag_agent-hops1-2-batch2``).

    python -m examples.rag_agent.train --seed 0 [--hops 1 2] [--steps N] [--batch-size N] [--n-rollouts N]
"""

from examples.rag_agent.spec import SPEC
from examples.training import train_command

main = train_command(SPEC, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
