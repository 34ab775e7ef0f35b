"""Train the calculator agent (agent.py) with reinforcement learning, one seed.

SmolLM2-135M-Instruct with a LoRA adapter, trained on the two-operation problems
(``--operations``); the test split keeps 2 to 4 operations (:mod:`examples.training`).
The figures, tool-call validity and tool calls per episode included, go to
``results/<arm>-seed<N>.json``: the arm is ``calc_agent`` with the config's lr and
optimizer steps, and names what differs (``calc_agent-lr0.001``, ``calc_agent-skip``).

    python -m examples.calc_agent.train --seed 0 [--lr LR] [--steps-without-signal skip] [--steps N]
"""

from examples.calc_agent.spec import SPEC
from examples.training import train_command

main = train_command(SPEC, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
