"""The gateway's route table: Starlette routes, as the store server and the engine server have, answering
each request in the order the gateway always did (credential, then route, then method)."""

from __future__ import annotations

import httpx
from starlette.routing import Route, Router

from agl_trainer.gateway import app as gateway_app
from tests.gateway.conftest import ADMIN_TOKEN, TOKEN

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _call(gateway, method: str, path: str, token: str | None = TOKEN, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{gateway.url}{path}", headers=headers, **kw)


def test_the_gateway_routes_with_a_starlette_route_table():
    assert all(isinstance(route, Route) for route in gateway_app.TABLE)
    assert isinstance(gateway_app._TABLE_ROUTER, Router)
    assert gateway_app._TABLE_ROUTER.routes == gateway_app.TABLE
    listed = gateway_app.routes()
    assert ("POST", "/rollouts/{rollout_id}/v1/chat/completions") in listed and ("GET", "/health") in listed
    assert len(listed) == len(set(listed)) == len(gateway_app.TABLE)


def test_another_method_is_405_only_for_a_caller_with_a_credential(gateway):
    assert _call(gateway, "GET", "/v1/chat/completions", token=None).status_code == 401
    r = _call(gateway, "GET", "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert "use POST" in r.json()["error"]["message"] and r.headers["x-request-id"].startswith("req_")
    anthropic = _call(gateway, "GET", "/v1/messages")  # the Messages API's routes answer in its shape
    assert anthropic.status_code == 405 and anthropic.json()["type"] == "error"
    assert _call(gateway, "HEAD", "/v1/models").status_code == 405  # GET routes do not serve HEAD
    assert _call(gateway, "POST", "/admin/status", token=TOKEN).status_code == 403  # admin routes: admin first
    assert _call(gateway, "POST", "/admin/status", token=ADMIN_TOKEN).status_code == 405


def test_a_path_no_route_matches_is_404_after_its_area_s_credential_check(gateway):
    assert _call(gateway, "GET", "/nowhere", token=None).status_code == 401
    assert _call(gateway, "GET", "/nowhere").json()["error"]["code"] == "not_found"
    assert _call(gateway, "POST", "/v1/embeddings").status_code == 404
    assert _call(gateway, "GET", "/admin/nothing").status_code == 403
    nothing = _call(gateway, "GET", "/admin/nothing", token=ADMIN_TOKEN)
    assert nothing.status_code == 404 and "'nothing'" in nothing.json()["error"]["message"]
    hint = _call(gateway, "GET", "/rollouts/ro-1/models", token=ADMIN_TOKEN)
    assert hint.status_code == 404 and "/rollouts/{rollout_id}/v1/" in hint.json()["error"]["message"]


def test_a_trailing_slash_is_ignored(gateway):
    r = _call(gateway, "POST", "/v1/chat/completions/", json=CHAT)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert _call(gateway, "GET", "/v1/models/").json()["data"]


def test_the_rollout_id_is_the_raw_path_s_segment_whatever_route_its_decoded_form_matches(gateway):
    # a quoted id holding "/v1/models" reaches the chat route under that whole id (no such rollout)
    whole = _call(gateway, "POST", "/rollouts/a%2Fv1%2Fmodels/v1/chat/completions", token=ADMIN_TOKEN, json=CHAT)
    assert whole.status_code == 404 and whole.json()["error"]["code"] == "rollout_not_found"
    assert "a/v1/models" in whole.json()["error"]["message"]
    # an endpoint segment quoting "/v1/models" is no route, though the decoded path ends like one
    hidden = _call(gateway, "GET", "/rollouts/ro-1/v1/x%2Fv1%2Fmodels", token=ADMIN_TOKEN)
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
