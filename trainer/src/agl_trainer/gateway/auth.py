"""Who is calling the gateway, and what they may do.

Three credentials, each in ``Authorization: Bearer <credential>`` (the scheme in any case)
or, as the ``anthropic`` SDK sends its key, in ``x-api-key: <credential>`` (read when no
``Authorization`` header carries a bearer token; a credential opens the same routes
whichever header carries it):

- a **rollout key** (:class:`agl.credentials.RolloutKeys`), the only thing an agent holds.
  The rollout is the key's: a ``/rollouts/{id}/v1/...`` path or an ``X-Agl-Rollout-Id``
  header naming another rollout is refused (403; so is, whoever sends it, a header naming
  another rollout than the path), ``/v1/...`` with no header is the key's rollout, and the
  key works only while its attempt runs (the registry asks the store, cached for a second
  or so): then 401 ``rollout_key_expired``. Admin routes refuse it (403).
- the **gateway token**: production traffic, ``/v1/...`` of no rollout. It cannot name a
  rollout (403): whoever holds it is no agent under training.
- the **admin token**: the ``/admin/...`` routes, and any route (the trainer's own
  operations). Agents never get it.

The gateway checks rollout keys itself (an HMAC under the secret the key's minter holds
too); see :mod:`agl.credentials` for why keys are an HMAC and not a stored random value.
"""

from __future__ import annotations

from agl.credentials import RolloutKeys, bearer_of, looks_like_rollout_key
from agl_trainer.gateway.errors import GatewayError
from agl_trainer.http.bearer import ADMIN, ROLLOUT, Caller, caller_by_bearer

PRODUCTION = "production"
"""The gateway token's scope (beside :data:`ADMIN` and :data:`ROLLOUT`)."""


OPEN = Caller(ADMIN)
"""The caller of a gateway started with no token at all (tests of the pipeline only)."""


def unauthorized(message: str, code: str = "invalid_api_key") -> GatewayError:
    return GatewayError(401, message, type="authentication_error", code=code)


def forbidden(message: str) -> GatewayError:
    return GatewayError(403, message, type="permission_error", code="forbidden")


def api_key_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The credential of the first ``x-api-key`` header among raw (lower-cased) ASGI headers, if any."""
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1").strip() or None
    return None


class GatewayAuth:
    """Tells callers apart by their bearer credential."""

    def __init__(self, *, token: str | None, admin_token: str | None, keys: RolloutKeys | None):
        self.token = token
        self.admin_token = admin_token
        self.keys = keys

    @property
    def open(self) -> bool:
        return not self.token and not self.admin_token and self.keys is None

    def identify(self, headers: list[tuple[bytes, bytes]]) -> Caller:
        """The caller of a request with these (lower-cased) headers; 401 for no or a wrong credential."""
        if self.open:
            return OPEN
        given, where = bearer_of(headers), "bearer token"
        if given is None:
            given, where = api_key_of(headers), "x-api-key"
        if given is None:
            raise unauthorized(
                "missing credential (Authorization: Bearer <rollout key or token>, or x-api-key: <the same>)"
            )
        caller = caller_by_bearer(given, {ADMIN: self.admin_token, PRODUCTION: self.token}, self.keys)
        if caller is not None:
            return caller
        if self.keys is not None and looks_like_rollout_key(given):
            raise unauthorized(f"invalid {where}: not a rollout key of this gateway", code="invalid_rollout_key")
        raise unauthorized(f"invalid {where}")

    @staticmethod
    def rollout_of(caller: Caller, named: str | None, where: str) -> str | None:
        """The rollout a call belongs to: the key's; ``named`` (from ``where``) must agree with it."""
        if caller.scope == ROLLOUT:
            if named is not None and named != caller.rollout_id:
                raise forbidden(f"{where} names rollout {named!r}, but this rollout key is for another rollout")
            return caller.rollout_id
        if caller.scope == PRODUCTION and named is not None:
            raise forbidden(f"{where} names a rollout: a rollout's calls need its rollout key, not the gateway token")
        return named

    @staticmethod
    def admin_only(caller: Caller) -> None:
        if caller.scope != ADMIN:
            raise forbidden("admin routes need the gateway's admin token")
