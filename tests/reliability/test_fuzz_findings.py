"""What the fuzzer found, pinned: each case it once answered with a 5xx, now a clear 4xx."""

from __future__ import annotations

import httpx

from tests.reliability.targets import MODEL, gateway_target


def test_a_lone_surrogate_is_a_400_naming_the_field_and_a_surrogate_pair_is_fine(tmp_path):
    # was: json.loads accepts "\ud800" alone, the engine cannot encode the prompt, the gateway answered 502
    with gateway_target(tmp_path) as (target, _gateway):
        headers = {"Authorization": f"Bearer {target.credentials['key']}", "Content-Type": "application/json"}
        url = f"{target.url}/rollouts/ro-gw/v1"
        lone = b'{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 4}'
        answer = httpx.post(f"{url}/chat/completions", content=lone % MODEL.encode(), headers=headers, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "messages[0].content"
        assert "lone surrogate" in answer.json()["error"]["message"]

        lone = b'{"model": "%s", "input": [{"role": "user", "content": "x"}], "metadata": {"\\udfff": 1}}'
        answer = httpx.post(f"{url}/responses", content=lone % MODEL.encode(), headers=headers, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "metadata", answer.text

        pair = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 64}'
        answer = httpx.post(f"{url}/chat/completions", content=pair % MODEL.encode(), headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "echo: \N{GRINNING FACE}"
