"""Each call of a seeded rollout gets a sampling seed from the rollout's seed and its position.

The fake engine (a test double, tests/fake_engine.py) records the requests it receives.
"""

from __future__ import annotations

import openai

from agl.schema import Rollout
from agl_trainer.gateway.rollouts import RolloutSettings
from tests.gateway.conftest import key_of


def test_each_call_of_a_seeded_rollout_gets_its_own_seed_and_a_clients_seed_wins(gateway, engine, store):
    store.enqueue([Rollout(rollout_id="ro-seeded", task_id="task-1", seed=1234)])
    store.claim("runner", limit=1)
    key = key_of(gateway, store, "ro-seeded")
    with openai.OpenAI(base_url=gateway.rollout_base_url("ro-seeded"), api_key=key, max_retries=0) as client:
        for _ in range(2):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], seed=7)
        client.responses.create(model="m", input="hi")
    seeds = [r.get("seed") for r in engine.requests]
    settings = RolloutSettings(seed=1234)
    assert seeds == [settings.call_seed(0), settings.call_seed(1), 7, settings.call_seed(3)]
    assert len(set(seeds)) == 4 and all(0 <= s < 2**63 for s in seeds)


def test_an_unseeded_rollout_leaves_sampling_to_the_engine(client, engine):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "seed" not in engine.requests[-1]
