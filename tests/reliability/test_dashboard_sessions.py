"""Drills: dashboard sessions are per login and end at logout (issue 32).

Was: the login cookie was a digest of the admin token, the same on every login, and still
opened every page after logout (anyone who had copied it kept it for as long as the token
lived). Now each login gets a fresh random session id and logout ends it on the server.
"""

from __future__ import annotations

import httpx
import pytest

from agl_trainer.dashboard.sessions import Sessions
from tests.reliability.targets import store_target


def _login(url: str, token: str) -> str:
    answer = httpx.post(f"{url}/ui/login", data={"token": token, "next": "/ui/runs"}, timeout=10)
    assert answer.status_code == 303, answer.text
    return answer.cookies["agl_dashboard"]


def _opens(url: str, cookie: str) -> bool:
    page = httpx.get(f"{url}/ui/rollouts", cookies={"agl_dashboard": cookie}, timeout=10)
    assert page.status_code in (200, 303), page.status_code
    return page.status_code == 200


def test_each_login_gets_its_own_session_and_logout_ends_it_on_the_server(tmp_path):
    with store_target(tmp_path) as (target, _):
        url, token = target.url, target.credentials["admin"]
        first, second = _login(url, token), _login(url, token)
        assert first != second and token not in first and len(first) >= 40
        assert _opens(url, first) and _opens(url, second)

        out = httpx.post(f"{url}/ui/logout", cookies={"agl_dashboard": first}, timeout=10)
        assert out.status_code == 303 and 'agl_dashboard=""' in out.headers["set-cookie"]
        assert not _opens(url, first)  # a copy of the cookie kept from before the logout opens nothing
        assert _opens(url, second)  # another login's session goes on
        api = httpx.get(f"{url}/ui/rollouts", cookies={"agl_dashboard": first}, headers={"Accept": "application/json"})
        assert api.status_code == 401

        third = _login(url, token)
        assert third not in (first, second) and _opens(url, third)
        assert not _opens(url, "made-up-" + third[8:])


def test_a_session_ends_by_itself_after_its_lifetime_and_the_oldest_go_past_the_cap():
    now = [1000.0]
    sessions = Sessions(ttl_s=60, max_sessions=3, clock=lambda: now[0])
    a = sessions.start()
    now[0] += 59
    assert sessions.live(a)
    now[0] += 2
    assert not sessions.live(a) and len(sessions) == 0
    ids = [sessions.start() for _ in range(4)]
    assert [sessions.live(i) for i in ids] == [False, True, True, True]
    assert not sessions.live("") and not sessions.live(None)
    with pytest.raises(ValueError):
        Sessions(ttl_s=0)
