"""The trainer config (``train.yaml`` holds the same for ``agl train``).

Every LLM call of an episode is the one agent's (``researcher``), so all are trained;
credit is ``broadcast`` (each call of an episode gets its final F1: the searches that
found the passages earn what the answer earns). The sampling choices below were made on
the validation split, never on test (``results/val-samples/``).
"""

from __future__ import annotations

from typing import Any

from examples.learner import run_config

STEPS = 10
BATCH_SIZE = 1
N_ROLLOUTS = 8
"""One question a step, eight rollouts of it: a group learns only if its rollouts' F1 differ. One
question, not two, because nearly every one-hop group has such a difference (below), and an update
of one group (16 transitions) keeps a seed inside 30 minutes: the three seeds took 16 to 18. Two
one-hop questions a step would mostly both have signal, and updates of about 32 transitions (the
first arm's took up to 231 s) would put a seed near or past 30 minutes."""
TRAIN_HOPS = (1,)
"""The training questions: the one-hop ones (``data/train-1hop.jsonl``; the test split keeps both).
Chosen on validation: at 0.5 and a 96-token cap, 7 of the 8 one-hop validation questions had samples
whose F1 differ and 3 of the 12 two-hop ones did (4 samples each); with 8 samples each, 7 of 8
one-hop questions did (``evaluate.py --split val --hops 1 --temperature 0.5 --samples 8``). The
first arm trained on all hops, two questions a step, and did not learn (docs/results/rag-agent.md)."""
TEMPERATURE = 0.5
"""The sampling temperature of training rollouts (the agent reads ``resources["temperature"]``; the
backend divides its logits by the same number). On the 20 validation questions, 4 samples each
(``evaluate.py --split val --temperature T --samples 4``): at 1.0 all 80 answers scored F1 0, so no
group would learn anything; at 0.5, 6 of 20 questions had samples whose F1 differ."""
MAX_RESPONSE_TOKENS = 96
"""The cap on every response, at the gateway and as the agent's own ``max_tokens``; a search call
takes about 25 tokens. The base model often answers by restating a passage, which a cap of 48 cut
(the episode then ends with no answer): at 0.5 on the same validation samples, 28 of 80 episodes
were cut at 48 and 6 at 96, and 10 of 20 questions had samples whose F1 differ at 96 (6 at 48),
for 24% more wall time (368 s against 297 s)."""
LR = 3e-4
"""This example's value from before any run; not tuned."""
TRANSITIONS = {"credit": "broadcast"}
DEFAULTS = dict(steps=STEPS, batch_size=BATCH_SIZE, n_rollouts=N_ROLLOUTS, max_response_tokens=MAX_RESPONSE_TOKENS)
"""What a run may override: ``--steps``, ``--batch-size``, ``--n-rollouts``, ``--max-response-tokens``."""


def trainer_config(**run: Any) -> dict[str, Any]:
    """The :class:`agl_trainer.TrainerConfig` dict of one seed (``run``: see :func:`examples.learner.run_config`)."""
    return run_config(
        run, DEFAULTS, lr=LR, temperature=TEMPERATURE, transitions=TRANSITIONS, timeout_s=1800, agent_max_tokens=True
    )
