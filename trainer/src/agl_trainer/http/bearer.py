"""Who sent a request, told by its bearer credential: what the store server and the gateway share.

Each server has its own scopes and decides what each may do (``store_server/auth.py``,
``gateway/auth.py``); both name an admin scope and a rollout scope (a rollout key,
:class:`agl.credentials.RolloutKeys`), and both find the caller the same way:
:func:`caller_by_bearer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from agl.credentials import RolloutKeys, looks_like_rollout_key, same_token

ADMIN, ROLLOUT = "admin", "rollout"


class Caller(NamedTuple):
    """Who sent a request: its scope, and for a rollout key the rollout and attempt."""

    scope: str
    rollout_id: str | None = None
    attempt: int | None = None


def caller_by_bearer(given: str, tokens: Mapping[str, str | None], keys: RolloutKeys | None) -> Caller | None:
    """The caller holding ``given``: the scope of the first of ``tokens`` (scope → the token, None
    for one the server does not take) that it equals, else the rollout of the rollout key it is
    under ``keys``; None for anything else. Tokens are compared in constant time."""
    for scope, token in tokens.items():
        if same_token(given, token):
            return Caller(scope)
    if keys is not None and looks_like_rollout_key(given):
        found = keys.check(given)
        if found is not None:
            return Caller(ROLLOUT, found[0], found[1])
    return None


__all__ = ["ADMIN", "ROLLOUT", "Caller", "caller_by_bearer"]
