"""Several replicas: stickiness, load spreading, retries, saturation, pause/resume, admin routes."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import httpx
import pytest

from agl_trainer.gateway import Gateway
from tests.conftest import free_port, wait_until
from tests.fake_engine import FakeEngine
from tests.gateway.conftest import TOKEN, calls_of, new_rollout

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADMIN = "routing-admin-token"


def chat(url: str, rollout: str | None = None, key: str | None = None, **kw) -> httpx.Response:
    """A chat call: of a rollout with its ``key``, else production traffic with the gateway token."""
    path = f"/rollouts/{rollout}/v1/chat/completions" if rollout else "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"} if key else AUTH
    return httpx.post(f"{url}{path}", json=BODY, headers=headers, timeout=30, **kw)


@pytest.fixture
def two_engines():
    with FakeEngine(delay_s=0.05) as a, FakeEngine(delay_s=0.05) as b:
        yield a, b


def test_a_rollout_sticks_to_one_replica_and_load_spreads(store, two_engines):
    a, b = two_engines
    rollouts = [new_rollout(store, f"ro-{i}") for i in range(8)]
    with Gateway(store, [a.url, b.url], token=TOKEN) as gw:
        with cf.ThreadPoolExecutor(8) as pool:
            for _ in range(3):  # three turns per rollout, the rollouts concurrent
                answers = pool.map(lambda r: chat(gw.url, r, gw.rollout_key(r, 1)), rollouts)
                assert all(r.status_code == 200 for r in answers)
        served = {}
        for engine in (a, b):
            for req in engine.requests:
                served.setdefault(req["messages"][0]["content"], set())
        gw.flush()
    # each rollout's three calls went to one replica: count per replica is a multiple of 3
    assert len(a.requests) % 3 == 0 and len(b.requests) % 3 == 0
    assert len(a.requests) > 0 and len(b.requests) > 0, "concurrent rollouts should spread over both replicas"
    sticky = gw.router._sticky
    assert {sticky[r].url for r in rollouts} == {a.url, b.url}


def test_transient_errors_are_retried_on_another_replica(store, rollout):
    with FakeEngine() as a, FakeEngine() as b:
        a.fail_next.append(503)
        b.fail_next.append(503)
        with Gateway(store, [a.url, b.url], token=TOKEN) as gw:
            key = gw.rollout_key(rollout, 1)
            r = chat(gw.url, rollout, key)  # first replica 503 → second replica 503 → 503 to the client
            assert r.status_code == 503
            r = chat(gw.url, rollout, key)
            assert r.status_code == 200
            dead = f"http://127.0.0.1:{free_port()}/v1"
            gw.set_upstreams([dead, a.url])
            assert all(chat(gw.url).status_code == 200 for _ in range(3))  # connect errors retried on a
            assert [c.call_id for c in calls_of(gw, store, rollout)] == [r.json()["id"]]


def test_saturation_answers_429_with_retry_after(store):
    with (
        FakeEngine(delay_s=2.0) as eng,  # long enough to send the second request while the engine holds the first
        Gateway(store, [eng.url], token=TOKEN, max_in_flight=1) as gw,
        cf.ThreadPoolExecutor(2) as pool,
    ):
        slow = pool.submit(chat, gw.url)
        wait_until(lambda: eng.in_flight == 1, "the engine works on the first request")
        assert gw.status()["upstreams"][0]["in_flight"] == 1  # the replica is full
        r = chat(gw.url)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "gateway_saturated"
        assert slow.result().status_code == 200


def test_pause_drains_in_flight_and_holds_new_requests(store):
    with (
        FakeEngine() as eng,
        Gateway(store, [eng.url], token=TOKEN) as gw,
        cf.ThreadPoolExecutor(2) as pool,
    ):
        eng.hold = threading.Event()  # the engine answers once the test lets it
        first = pool.submit(chat, gw.url)
        wait_until(lambda: eng.in_flight == 1, "the engine works on the request")
        pausing = pool.submit(lambda: (gw.pause(timeout_s=5), eng.hold.is_set()))
        wait_until(lambda: gw.paused, "the gateway pauses")
        eng.hold.set()
        # pause returned True, and only once the request in flight had been let go
        assert pausing.result(timeout=5) == (True, True) and eng.in_flight == 0
        assert first.result(timeout=2).status_code == 200
        held = pool.submit(chat, gw.url)
        wait_until(lambda: gw.status()["held"] == 1, "the request waits at the gate")
        assert not held.done() and len(eng.requests) == 1  # waiting at the gate, not failed
        gw.resume()
        assert held.result(timeout=5).status_code == 200


def test_admin_routes_drive_a_gateway_from_another_process(store, engine):
    with Gateway(store, [engine.url], token=TOKEN, admin_token=ADMIN) as gw:
        admin = httpx.Client(base_url=f"{gw.url}/admin", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert httpx.post(f"{gw.url}/admin/pause").status_code == 401
        assert httpx.post(f"{gw.url}/admin/pause", headers=AUTH).status_code == 403  # the gateway token is no admin
        assert admin.post("/pause", params={"timeout_s": 5}).json() == {"paused": True, "drained": True, "in_flight": 0}
        assert admin.get("/status").json()["paused"] is True
        assert admin.post("/model_version", json={"model_version": "v7"}).json() == {"model_version": "v7"}
        assert admin.post("/resume").json() == {"paused": False}
        r = chat(gw.url)
        assert r.status_code == 200
        admin.post("/flush")
        [call] = store.query_llm_calls(production=True)
        assert call.model_version == "v7" and gw.model_version == "v7"
        status = admin.get("/status").json()
        assert status["recorded"] == 1 and status["upstreams"][0]["served_model"] == "fake-policy"
        assert admin.post("/model_version", json={"model_version": 3}).json()["error"]["param"] == "model_version"
        assert admin.post("/upstreams", json={"upstreams": []}).status_code == 400
        assert admin.post("/upstreams", json={"upstreams": [engine.url]}).json() == {"upstreams": [engine.url]}
        assert admin.post("/nope").status_code == 404


def test_pause_times_out_while_a_request_is_still_running(store):
    with (
        FakeEngine(delay_s=1.0) as eng,
        Gateway(store, [eng.url], token=TOKEN) as gw,
        cf.ThreadPoolExecutor(1) as pool,
    ):
        slow = pool.submit(chat, gw.url)
        wait_until(lambda: eng.in_flight == 1, "the engine works on the request")
        assert gw.pause(timeout_s=0.1) is False and gw.paused
        gw.resume()
        assert slow.result().status_code == 200 and not gw.paused


def test_a_new_model_version_is_served_under_its_own_name_when_the_engine_lists_it(store, engine):
    with Gateway(store, [engine.url], token=TOKEN) as gw:
        assert chat(gw.url).status_code == 200 and engine.requests[-1]["model"] == "fake-policy"
        engine.extra_models = ["v2"]  # the engine loaded v2 as a model of its own (a LoRA adapter, say)
        gw.model_version = "v2"
        assert chat(gw.url).status_code == 200 and engine.requests[-1]["model"] == "v2"
        gw.model_version = "v3"  # a version the engine does not list by name: its first model
        assert chat(gw.url).status_code == 200 and engine.requests[-1]["model"] == "fake-policy"
        gw.flush()
        assert [c.model_version for c in store.query_llm_calls(production=True)] == [None, "v2", "v3"]


def test_stop_while_paused_answers_held_requests(store, engine):
    gw = Gateway(store, [engine.url], token=TOKEN).start()
    gw.pause()
    with cf.ThreadPoolExecutor(1) as pool:
        held = pool.submit(chat, gw.url)
        wait_until(lambda: gw.status()["held"] == 1, "the request waits at the gate")
        assert not held.done()
        t0 = time.monotonic()
        gw.stop()
        assert held.result(timeout=5).status_code == 200 and time.monotonic() - t0 < 5
