"""The model version a client is told is the one its call is recorded with (and exported with).

The gateway's own version wins when it has one (``--model-version``, or the trainer's latest:
an operator's or the trainer's naming of what is deployed); without one, the version the
engine's answer names (agl's engines name theirs, as ``base`` before any training); with
neither, none, in the answer and in the record alike.
"""

from __future__ import annotations

import openai
import pytest

from agl_trainer.gateway import Gateway
from tests.gateway.conftest import TOKEN, calls_of, key_of

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("engine_names", "gateway_names", "told"),
    [("base", None, "base"), ("base", "v3", "v3"), (None, "v3", "v3"), (None, None, None)],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_client_and_the_record_hold_the_same_model_version(
    store, engine, rollout, engine_names, gateway_names, told, stream
):
    engine.model_version = engine_names
    with Gateway(store, [engine.url], token=TOKEN, model_version=gateway_names) as gateway:
        key = key_of(gateway, store, rollout)
        with openai.OpenAI(base_url=gateway.rollout_base_url(rollout), api_key=key, max_retries=0) as client:
            if stream:
                chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
                seen = {(c.model_extra or {}).get("model_version") for c in chunks}
            else:
                answer = client.chat.completions.create(model="m", messages=MESSAGES)
                seen = {(answer.model_extra or {}).get("model_version")}
        [call] = calls_of(gateway, store, rollout)
    assert seen == {told}
    assert call.model_version == told
    assert call.response.get("model_version") == told
