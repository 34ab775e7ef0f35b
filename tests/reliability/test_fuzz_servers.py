"""Drill: a seeded fuzzer over every route of the store server and of the gateway.

Requests are mostly almost right (see :mod:`tests.reliability.fuzz`); none may be
answered 5xx or left without an answer, and each server must still answer its health
check and a normal request afterwards. Every route the server lists (its own route table,
so a route added later is in it) must receive its share of the requests. A failure names
the seed and the request, so ``AGL_FUZZ_SEED=<seed>`` replays it (``AGL_FUZZ_REQUESTS``
sends more or fewer); other seeds explore further (the soak benchmark runs many).
"""

from __future__ import annotations

import logging
import os

import httpx

from tests.reliability.fuzz import Fuzzer, Outcome, Target, run
from tests.reliability.targets import MODEL, gateway_routes, gateway_target, store_routes, store_target

SEED = int(os.environ.get("AGL_FUZZ_SEED", "1616"))
REQUESTS = int(os.environ.get("AGL_FUZZ_REQUESTS", "1000"))
"""Requests to each server (a few seconds each on loopback)."""
PER_ROUTE = 5
"""The fewest requests each route the server serves must receive."""


def _server_errors(caplog) -> list[str]:
    """What the servers logged as errors: an internal error the client may never have seen (a hang-up)."""
    return [f"{r.name}: {r.getMessage()[:300]}" for r in caplog.records if r.levelno >= logging.ERROR]


def _check(outcome: Outcome, target: Target, caplog) -> None:
    assert not outcome.failures, outcome.report()
    assert not _server_errors(caplog), (f"seed {SEED}", _server_errors(caplog)[:5])
    assert outcome.sent == REQUESTS and sum(s < 300 for s in outcome.statuses) > 0, outcome.report()
    assert len(target.served) > 15, target.served  # the server's own list, not an empty one
    missed = outcome.missed(target.served, PER_ROUTE)
    assert not missed, f"seed {SEED}: routes that got fewer than {PER_ROUTE} requests: {missed}"


def test_fuzzing_the_store_server_gets_no_5xx_and_leaves_it_serving(tmp_path, caplog):
    with store_target(tmp_path) as (target, store):
        outcome = run(Fuzzer(SEED, store_routes()), target, REQUESTS)
        _check(outcome, target, caplog)
        assert {"POST /ui/login", "POST /ui/logout", "POST /v1/batch"} <= set(outcome.by_route)
        admin = {"Authorization": f"Bearer {target.credentials['admin']}"}
        assert httpx.get(f"{target.url}/healthz", timeout=10).status_code == 200
        answer = httpx.post(
            f"{target.url}/v1/spans",
            json={"spans": [{"span_id": "after-fuzz", "rollout_id": "ro-run", "name": "step"}]},
            headers=admin,
            timeout=10,
        )
        assert answer.status_code < 300, answer.text
        assert [s.span_id for s in store.query_spans(rollout_id="ro-run") if s.span_id == "after-fuzz"] == [
            "after-fuzz"
        ]


def test_fuzzing_the_gateway_gets_no_5xx_and_leaves_it_serving(tmp_path, caplog):
    with gateway_target(tmp_path) as (target, _gateway):
        outcome = run(Fuzzer(SEED, gateway_routes()), target, REQUESTS)
        _check(outcome, target, caplog)
        assert {"POST /rollouts/{rollout_id}/v1/chat/completions", "GET /admin/status"} <= set(outcome.by_route)
        assert httpx.get(f"{target.url}/health", timeout=10).status_code == 200
        answer = httpx.post(
            f"{target.url}/rollouts/ro-gw/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 64},
            headers={"Authorization": f"Bearer {target.credentials['key']}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"].startswith("echo: still there?")
