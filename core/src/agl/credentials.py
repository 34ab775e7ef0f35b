"""Bearer tokens agl makes up when none is given (gateway, store server, engine)."""

from __future__ import annotations

import secrets


def new_token(nbytes: int = 24) -> str:
    """A random URL-safe token of ``nbytes`` random bytes that never starts with ``-``.

    A leading ``-`` would make ``--token VALUE`` look like two options to a command line.
    """
    while True:
        token = secrets.token_urlsafe(nbytes)
        if not token.startswith("-"):
            return token
