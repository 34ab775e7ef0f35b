"""Rollout keys at the gateway: a key opens its own rollout's routes, while its attempt runs, and nothing else.

A real gateway on 127.0.0.1 in front of the fake engine (a test double, tests/fake_engine.py)
and a real SQLite store.
"""

from __future__ import annotations

import httpx
import pytest

from agl.credentials import RolloutKeys, read_token
from agl.errors import ConfigError
from agl.schema import Rollout, RolloutStatus
from tests.conftest import wait_until
from tests.gateway.conftest import ADMIN_TOKEN, TOKEN, calls_of, key_of, new_rollout

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(gateway, path: str, credential: str, scheme: str = "Bearer", **headers: str) -> httpx.Response:
    headers = {"Authorization": f"{scheme} {credential}", **headers}
    return httpx.post(f"{gateway.url}{path}", json=BODY, headers=headers, timeout=10)


@pytest.fixture
def other(store) -> str:
    return new_rollout(store, "ro-other")


def test_a_key_cannot_write_into_another_rollout_by_path_or_header(gateway, store, rollout, key, other):
    by_path = chat(gateway, f"/rollouts/{other}/v1/chat/completions", key)
    assert by_path.status_code == 403 and by_path.json()["error"]["type"] == "permission_error"
    assert other in by_path.json()["error"]["message"]
    by_header = chat(gateway, "/v1/chat/completions", key, **{"X-Agl-Rollout-Id": other})
    assert by_header.status_code == 403
    assert calls_of(gateway, store, other) == []
    # the key's own rollout, named or not: /v1 with no header is the key's rollout too
    own = [
        chat(gateway, f"/rollouts/{rollout}/v1/chat/completions", key),
        chat(gateway, "/v1/chat/completions", key),
        chat(gateway, "/v1/chat/completions", key, **{"X-Agl-Rollout-Id": rollout}),
    ]
    assert [r.status_code for r in own] == [200, 200, 200]
    assert [c.call_id for c in calls_of(gateway, store, rollout)] == [r.json()["id"] for r in own]
    assert list(store.query_llm_calls(production=True)) == []


def test_the_gateway_token_is_production_traffic_only(gateway, store, rollout):
    assert chat(gateway, f"/rollouts/{rollout}/v1/chat/completions", TOKEN).status_code == 403
    assert chat(gateway, "/v1/chat/completions", TOKEN, **{"X-Agl-Rollout-Id": rollout}).status_code == 403
    assert chat(gateway, "/v1/chat/completions", TOKEN).status_code == 200
    assert calls_of(gateway, store, rollout) == []


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/admin/upstreams", {"upstreams": ["http://127.0.0.1:9/v1"]}),
        ("POST", "/admin/pause", {}),
        ("POST", "/admin/model_version", {"model_version": "mine"}),
        ("POST", "/admin/rollout_keys", {"rollout_id": "ro-other"}),
        ("GET", "/admin/status", None),
    ],
)
def test_neither_a_key_nor_the_gateway_token_reaches_admin_routes(gateway, key, other, method, path, body):
    upstreams = [r.url for r in gateway.router.replicas]
    for credential in (key, TOKEN):
        r = httpx.request(method, f"{gateway.url}{path}", json=body, headers={"Authorization": f"Bearer {credential}"})
        assert r.status_code == 403 and "admin token" in r.json()["error"]["message"]
    assert [r.url for r in gateway.router.replicas] == upstreams
    assert not gateway.paused and gateway.model_version == "v1"
    admin = httpx.request(method, f"{gateway.url}{path}", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert admin.status_code == 200, admin.text
    gateway.resume()


def test_a_key_stops_working_when_its_rollout_ends_and_a_retry_gets_a_new_one(gateway, store):
    gateway.registry.status_ttl_s = 0.0  # ask the store every time (1 s in production)
    store.enqueue([Rollout(rollout_id="ro-retry", task_id="task-1", max_attempts=2)])
    (claimed,) = store.claim("runner-a")
    first = gateway.rollout_key("ro-retry", claimed.attempt)
    path = "/rollouts/ro-retry/v1/chat/completions"
    assert chat(gateway, path, first).status_code == 200
    store.finish("ro-retry", RolloutStatus.FAILED, error="boom")  # queued again for attempt 2
    expired = chat(gateway, path, first)
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "rollout_key_expired"
    (again,) = store.claim("runner-b")
    assert again.attempt == 2
    assert chat(gateway, path, first).status_code == 401  # attempt 1's key does not open attempt 2
    second = gateway.rollout_key("ro-retry", 2)
    assert chat(gateway, path, second).status_code == 200
    store.finish("ro-retry", RolloutStatus.SUCCEEDED)
    assert chat(gateway, path, second).status_code == 401
    assert len(calls_of(gateway, store, "ro-retry")) == 2


def test_a_key_for_a_queued_rollout_or_made_with_another_secret_is_refused(gateway, store, rollout):
    store.enqueue([Rollout(rollout_id="ro-queued", task_id="task-1")])
    queued = chat(gateway, "/v1/chat/completions", gateway.rollout_key("ro-queued", 1))
    assert queued.status_code == 401 and queued.json()["error"]["code"] == "rollout_key_expired"
    forged = RolloutKeys("another secret of enough bytes").mint(rollout, 1)
    r = chat(gateway, f"/rollouts/{rollout}/v1/chat/completions", forged)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_rollout_key"
    tampered = key_of(gateway, store, rollout)[:-2] + "AA"
    assert chat(gateway, f"/rollouts/{rollout}/v1/chat/completions", tampered).status_code == 401


def test_the_bearer_scheme_is_read_in_any_case(gateway, rollout, key):
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert chat(gateway, f"/rollouts/{rollout}/v1/chat/completions", key, scheme=scheme).status_code == 200
    assert chat(gateway, f"/rollouts/{rollout}/v1/chat/completions", key, scheme="Basic").status_code == 401


def test_the_admin_hands_out_the_key_of_a_running_attempt(gateway, store, rollout, key):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    r = httpx.post(f"{gateway.url}/admin/rollout_keys", json={"rollout_id": rollout}, headers=admin)
    assert r.status_code == 200 and r.json() == {"rollout_key": key}
    store.enqueue([Rollout(rollout_id="ro-later", task_id="task-1")])
    r = httpx.post(f"{gateway.url}/admin/rollout_keys", json={"rollout_id": "ro-later"}, headers=admin)
    assert r.status_code == 409 and r.json()["error"]["code"] == "rollout_not_running"


def test_keys_name_their_rollout_and_attempt_and_tokens_come_from_files(tmp_path, monkeypatch):
    keys = RolloutKeys("s" * 32)
    key = keys.mint("task-set/17.ro", 3)
    assert keys.check(key) == ("task-set/17.ro", 3)
    assert keys.check(key.replace(".3.", ".4.", 1)) is None  # the attempt is under the MAC
    with pytest.raises(ConfigError, match="16 bytes"):
        RolloutKeys("short")
    path = tmp_path / "token"
    path.write_text("from-a-file\n")
    monkeypatch.setenv("SOME_TOKEN", "from-env")
    assert read_token("--token", None, path, "SOME_TOKEN") == "from-a-file"
    assert read_token("--token", None, None, "SOME_TOKEN") == "from-env"
    with pytest.raises(ConfigError, match="--token-file: cannot read"):
        read_token("--token", None, tmp_path / "missing")
    path.write_text("\n")
    with pytest.raises(ConfigError, match="--token-file: .* is empty"):
        read_token("--token", None, path)


def test_a_straggler_of_the_last_attempt_does_not_lock_out_the_next_one(gateway, store):
    """With the default cache (1 s): an ended attempt's key is refused once the cache lapses,
    and the refusal is not kept, so the next attempt's key works the moment it is claimed."""
    store.enqueue([Rollout(rollout_id="ro-s", task_id="task-1", max_attempts=2)])
    store.claim("runner-a")
    path = "/rollouts/ro-s/v1/chat/completions"
    assert chat(gateway, path, gateway.rollout_key("ro-s", 1)).status_code == 200
    store.finish("ro-s", RolloutStatus.FAILED, error="boom")
    wait_until(  # cached as running for up to 1 s
        lambda: chat(gateway, path, gateway.rollout_key("ro-s", 1)).status_code != 200,
        "the ended attempt's key stops working",
        step_s=0.1,
    )
    (again,) = store.claim("runner-b")
    assert chat(gateway, path, gateway.rollout_key("ro-s", again.attempt)).status_code == 200


def test_a_rollouts_first_call_asks_the_store_about_it_once(gateway, store, rollout, key, monkeypatch):
    """The key check and the rollout's ``seq`` and settings come from one lookup: one
    ``get_rollout`` for the first call, none for the next ones while the answer is fresh; with
    no time to trust it, each call asks again, and a finished rollout's key is refused."""
    asked: list[str] = []
    real = store.get_rollout

    def counting(rollout_id: str):
        asked.append(rollout_id)
        return real(rollout_id)

    monkeypatch.setattr(store, "get_rollout", counting)
    gateway.registry.status_ttl_s = 60.0  # fresh throughout the next four calls, however loaded the host (1 s was not)
    path = f"/rollouts/{rollout}/v1/chat/completions"
    assert chat(gateway, path, key).status_code == 200
    assert asked == [rollout]
    assert [chat(gateway, path, key).status_code for _ in range(3)] == [200, 200, 200]
    assert asked == [rollout]
    assert [c.seq for c in calls_of(gateway, store, rollout)] == [0, 1, 2, 3]
    gateway.registry.status_ttl_s = 0.0
    assert chat(gateway, path, key).status_code == 200
    assert asked == [rollout, rollout]
    store.finish(rollout, RolloutStatus.SUCCEEDED)
    refused = chat(gateway, path, key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "rollout_key_expired"
    assert "(the rollout is succeeded)" in refused.json()["error"]["message"]
