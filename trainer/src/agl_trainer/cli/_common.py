"""What several ``agl`` commands share: the ``--store`` flag, how a command opens its store, and
the credential flags.

Every credential has one flag name wherever it is taken, a ``-file`` form (a file's first
line, kept out of the process list) and one variable (:mod:`agl.env`):

============================  ===================================================  ================================
flag (and ``-file`` form)     the credential                                       variable
============================  ===================================================  ================================
``--admin-token``             ``agl store serve``'s admin token; the token         ``$AGL_STORE_TOKEN``
                              ``agl dashboard``'s pages ask for
``--admin-token``             ``agl gateway serve``'s ``/admin`` token             ``$AGL_GATEWAY_ADMIN_TOKEN``
``--runner-token``            ``agl store serve``'s runner token                   ``$AGL_STORE_RUNNER_TOKEN``
``--gateway-token``           the gateway's production token (``agl gateway        ``$AGL_GATEWAY_TOKEN``
                              serve`` checks it, ``agl runner`` sends it)
``--store-token``             what a client sends an ``http://`` store (every      ``$AGL_STORE_TOKEN``
                              command that opens a store)
``--engine-token``            what the engines expect (``agl engine serve``        ``$AGL_ENGINE_API_KEY``
                              checks it, ``agl gateway serve`` sends it)
``--rollout-key-secret-file`` the secret rollout keys are made with (a file only)  ``$AGL_ROLLOUT_KEY_SECRET``
============================  ===================================================  ================================

``--admin-token`` names the admin credential *of the server the command starts*, so it is
the same flag on both servers with each server's own variable. A flag never reads another
credential's variable, and :func:`store_options` reads only ``--store-token``: the gateway's
token cannot reach the store client. The old ``--token``, ``--token-file`` and
``--upstream-api-key`` are refused by :func:`retire_flag` with an error naming the new flag.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agl import env
from agl.credentials import read_token
from agl.store.base import DEFAULT_STORE_URL

if TYPE_CHECKING:
    from agl.store.base import Store


def store_help(note: str = "the store agl train uses too") -> str:
    """The ``--store`` help: the default (one for every command and the trainer), then ``note``."""
    return f"store URL (default: ${env.STORE_URL}, else {DEFAULT_STORE_URL}, {note})"


STORE_HELP = store_help()


def add_store_argument(parser: argparse.ArgumentParser, help: str = STORE_HELP) -> None:
    """``--store URL``, defaulting (at open time) to :func:`agl.store.base.default_store_url`."""
    parser.add_argument("--store", metavar="URL", default=None, help=help)


@dataclass(frozen=True)
class Credential:
    """A bearer token a command takes: ``FLAG TOKEN``, ``FLAG-file PATH``, else ``$variable``."""

    flag: str
    """The flag, e.g. ``--admin-token``; ``{flag}-file`` is its file form."""
    variable: env.Variable
    """The variable read when neither flag is given."""
    what: str
    """What the token is, for ``--help``."""

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments holding the flag's value (``admin_token``)."""
        return self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser, unset: str = "none") -> None:
        """Add ``FLAG`` and ``FLAG-file`` to ``parser``; ``unset`` says what happens with neither nor the variable."""
        parser.add_argument(
            self.flag, metavar="TOKEN", default=None, help=f"{self.what} (default: ${self.variable}, else {unset})"
        )
        parser.add_argument(
            f"{self.flag}-file", metavar="PATH", default=None, help=f"file holding {self.flag} (kept out of argv)"
        )

    def given(self, args: argparse.Namespace) -> str | None:
        """The token from the flag or its file, None when neither was given (the variable is not read)."""
        return read_token(self.flag, getattr(args, self.dest), getattr(args, f"{self.dest}_file"))

    def read(self, args: argparse.Namespace) -> str | None:
        """The token from the flag, its file or the variable, in that order; None when none is set."""
        return self.given(args) or read_token(self.flag, env=self.variable)

    def source(self, args: argparse.Namespace) -> str | None:
        """Where :meth:`read` finds the token (the flag, its file or ``$VARIABLE``), None when nowhere."""
        if getattr(args, self.dest) is not None:
            return self.flag
        if getattr(args, f"{self.dest}_file") is not None:
            return f"{self.flag}-file"
        return f"${self.variable}" if read_token(self.flag, env=self.variable) else None


ENGINE_TOKEN = Credential("--engine-token", env.ENGINE_API_KEY, "bearer token the engines expect")
"""What ``agl engine serve`` checks and the gateway sends its upstream engines."""

STORE_CLIENT = Credential("--store-token", env.STORE_TOKEN, "bearer token for an http:// store")
"""What a command sends an ``http://`` store: its admin token, or a runner token for ``agl runner``."""


class _RetiredFlag(argparse.Action):
    """An old flag: using it is an error naming the flag that took its place."""

    def __init__(self, option_strings, dest, instead: str, **kwargs):
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):
        raise argparse.ArgumentError(self, f"no longer taken: {self.instead}")


def retire_flag(parser: argparse.ArgumentParser, old: str, instead: str) -> None:
    """Refuse ``old`` on ``parser`` with an error that says ``instead`` (what to do now); hidden from ``--help``."""
    parser.add_argument(old, action=_RetiredFlag, instead=instead, help=argparse.SUPPRESS)


def retire_token_flags(parser: argparse.ArgumentParser, credential: Credential, old: str = "--token") -> None:
    """Refuse ``old`` and ``old-file`` on ``parser``, naming ``credential``'s flags instead."""
    retire_flag(parser, old, f"use {credential.flag} ({credential.what})")
    retire_flag(parser, f"{old}-file", f"use {credential.flag}-file ({credential.what})")


def add_header_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """``--header-timeout S``: how long a server gives a client to send a request's headers."""
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a client has to send a request's headers before its connection is closed (default 10)",
    )


def header_timeout(args: argparse.Namespace) -> float:
    """``--header-timeout``, checked: ConfigError unless a positive number of seconds."""
    from agl.errors import ConfigError
    from agl_trainer.http.header_timeout import check_header_timeout

    try:
        return check_header_timeout(args.header_timeout)
    except ValueError as exc:
        raise ConfigError(f"--header-timeout: {str(exc).partition(': ')[2]}") from None


def add_store_client_arguments(parser: argparse.ArgumentParser) -> None:
    """What a command that opens a store takes: ``--store URL``, and ``--store-token TOKEN`` or
    ``--store-token-file PATH`` for an ``http://`` store (read back by :func:`store_options`)."""
    add_store_argument(parser)
    STORE_CLIENT.add_to(parser)


def store_options(args: argparse.Namespace, url: str) -> dict:
    """The ``open_store`` options for ``url``: the token from ``--store-token`` or ``--store-token-file``
    for an ``http://`` store (none given: the client reads ``$AGL_STORE_TOKEN``). No other
    credential is ever read here."""
    if not url.startswith(("http://", "https://")):
        return {}
    token = STORE_CLIENT.given(args)
    return {"token": token} if token else {}


BRIEF_POSTGRES_RETRIES = {"retries": 3, "retry_delay_s": 0.25, "connect_timeout_s": 3.0}
"""How a command that does one thing and exits (``agl rollouts``, ``agl spans``, ``agl store stats``,
``agl export``) tries a PostgreSQL server that does not answer: 4 tries within about 2 s, each
connection given 3 s, then its one error line saying how many retries over how long. Commands
that keep running (the trainer, runners, servers) keep the store's own, longer budget."""


def open_for_command(args: argparse.Namespace, url: str) -> Store:
    """The existing store at ``url`` for a command that does one thing and exits: a SQLite file
    that does not exist is an error naming it, never a new empty store; a server that does not
    answer is one error line after a brief retry (:data:`BRIEF_POSTGRES_RETRIES`), its retries
    logged only with ``-v`` (the error says how many there were)."""
    from agl.store.base import open_store

    options = store_options(args, url)
    if url.split("://", 1)[0].lower() in ("postgresql", "postgres"):
        options = BRIEF_POSTGRES_RETRIES | options
    stores_log = logging.getLogger("agl.store")
    level = stores_log.level
    if not getattr(args, "verbose", False):
        stores_log.setLevel(logging.ERROR)
    try:
        return open_store(url, create=False, **options)
    finally:
        stores_log.setLevel(level)
