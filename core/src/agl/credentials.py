"""Bearer tokens and rollout keys: making them, reading them, checking them.

agl has these kinds of credential (what each opens: :mod:`agl_trainer.gateway.auth` and
:mod:`agl_trainer.store_server.auth`):

- *tokens* a person or a trainer hands out: the store server's admin and runner tokens,
  the gateway's production and admin tokens. Made by :func:`new_token` when none is
  given; read from a flag, a file or the environment by :func:`read_token`, so a token
  never has to appear in the process list.
- *rollout keys*, one per attempt of a rollout, made by :class:`RolloutKeys` when the
  rollout is claimed. An agent holds only its rollout's key: the gateway and the store
  server take the rollout from the key, and accept it only while that attempt runs.

Rollout keys are an HMAC rather than random values stored with the attempt:
``agl-rk.<attempt>.<rollout id, base64url>.<HMAC-SHA256(secret, rollout id, attempt)>``.
The gateway checks one with no store round trip and no table of keys (it still asks the
store, through its small cache, whether the attempt runs, which it did already for the
rollout's settings); nothing secret is written to the database, so reading the store
(``agl rollouts show``, a backup) hands out no keys; and a claim, the hottest write of
all, stays one UPDATE. The cost is a secret shared by whoever mints keys (the store
server, the trainer, ``agl run``) and whoever checks them (the gateway, the store
server): ``$AGL_ROLLOUT_KEY_SECRET`` or a file. A key names its attempt, so it dies with
the attempt even though nothing is revoked: once the rollout ends or a new attempt
starts, the check against the store fails. Whoever holds the secret can make any
rollout's key, so it stays with the trainer and the servers: a runner whose agents run
in its own process should get keys from a store server's claims, not hold the secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path

from agl.env import ROLLOUT_KEY_SECRET
from agl.errors import ConfigError

_PREFIX = "agl-rk."
_KEY_SHAPE = re.compile(r"agl-rk\.(0|[1-9][0-9]{0,17})\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{43})")
"""A rollout key: an attempt of at most 18 ASCII digits (below 2**63), the rollout id in base64url,
the 43 base64url characters of its HMAC. Anything else is not a key, never an error."""


def new_token(nbytes: int = 24) -> str:
    """A random URL-safe token of ``nbytes`` random bytes that never starts with ``-``.

    A leading ``-`` would make ``--admin-token VALUE`` look like two options to a command line.
    """
    while True:
        token = secrets.token_urlsafe(nbytes)
        if not token.startswith("-"):
            return token


def read_token(
    name: str, value: str | None = None, file: str | os.PathLike[str] | None = None, env: str | None = None
) -> str | None:
    """A token from ``value`` (a flag), else the first line of ``file``, else ``$env``; None if none.

    ``name`` is the flag named in errors. A file that cannot be read, or an empty token
    from any source, is a :class:`~agl.errors.ConfigError`.
    """
    if value is not None and file is not None:
        raise ConfigError(f"{name}: give the token or a file holding it, not both")
    if file is not None:
        try:
            lines = Path(file).expanduser().read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"{name}-file: cannot read {file}: {exc.strerror or exc}") from None
        value = lines[0].strip() if lines else ""
        if not value:
            raise ConfigError(f"{name}-file: {file} is empty")
        return value
    if value is not None:
        if not value.strip():
            raise ConfigError(f"{name}: must not be empty")
        return value.strip()
    if env:
        found = os.environ.get(env, "").strip()
        return found or None
    return None


def bearer(header: bytes | str | None) -> str | None:
    """The token of an ``Authorization`` header: ``Bearer <token>``, the scheme in any case."""
    if not header:
        return None
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    scheme, _, token = text.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def bearer_of(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The bearer token of the first ``Authorization`` header among raw (lower-cased) ASGI headers."""
    for name, value in headers:
        if name == b"authorization":
            return bearer(value)
    return None


def same_token(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; False when either is missing."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


class RolloutKeys:
    """Makes and checks rollout keys under one secret (see the module docstring)."""

    def __init__(self, secret: str | bytes):
        raw = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(raw) < 16:
            raise ConfigError(f"{ROLLOUT_KEY_SECRET}: the rollout key secret needs at least 16 bytes")
        self._secret = raw

    @classmethod
    def generate(cls) -> RolloutKeys:
        """Keys under a new random secret (for one process that both mints and checks)."""
        return cls(new_token(32))

    @classmethod
    def from_env(cls, file: str | os.PathLike[str] | None = None) -> RolloutKeys | None:
        """Keys under the secret in ``file``, else ``$AGL_ROLLOUT_KEY_SECRET``; None when neither is set."""
        secret = read_token("--rollout-key-secret", None, file, ROLLOUT_KEY_SECRET)
        return cls(secret) if secret else None

    @property
    def secret(self) -> str:
        """The secret, to hand to another process that checks keys (never to an agent)."""
        return self._secret.decode("latin-1")

    def _mac(self, rollout_id: str, attempt: int) -> str:
        digest = hmac.new(self._secret, f"{rollout_id}\x00{attempt}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def mint(self, rollout_id: str, attempt: int) -> str:
        """The key of attempt ``attempt`` of ``rollout_id``."""
        rid = base64.urlsafe_b64encode(rollout_id.encode()).rstrip(b"=").decode()
        return f"{_PREFIX}{attempt}.{rid}.{self._mac(rollout_id, attempt)}"

    def check(self, key: str) -> tuple[str, int] | None:
        """``(rollout_id, attempt)`` for a key made under this secret, None for anything else."""
        shape = _KEY_SHAPE.fullmatch(key)
        if shape is None:
            return None
        digits, encoded, mac = shape.groups()
        try:
            rollout_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        attempt = int(digits)
        if not rollout_id or not hmac.compare_digest(mac.encode(), self._mac(rollout_id, attempt).encode()):
            return None
        return rollout_id, attempt


def looks_like_rollout_key(token: str | None) -> bool:
    """Whether ``token`` has a rollout key's shape (it may still be forged or expired)."""
    return bool(token) and token.startswith(_PREFIX)
