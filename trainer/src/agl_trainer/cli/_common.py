"""What several ``agl`` commands share: the ``--store`` flag and how a command opens its store."""

from __future__ import annotations

import argparse

from agl.store.base import DEFAULT_STORE_URL, STORE_URL_ENV


def store_help(note: str = "the store agl train uses too") -> str:
    """The ``--store`` help: the default (one for every command and the trainer), then ``note``."""
    return f"store URL (default: ${STORE_URL_ENV}, else {DEFAULT_STORE_URL}, {note})"


STORE_HELP = store_help()


def add_store_argument(parser: argparse.ArgumentParser, help: str = STORE_HELP) -> None:
    """``--store URL``, defaulting (at open time) to :func:`agl.store.base.default_store_url`."""
    parser.add_argument("--store", metavar="URL", default=None, help=help)


def add_store_token_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store-token-file PATH``: the token for an ``http://`` store, read from a file rather
    than argv (where the process list shows it); else ``$AGL_STORE_TOKEN``."""
    parser.add_argument(
        "--store-token-file",
        metavar="PATH",
        default=None,
        help="file holding the bearer token of an http:// store (default: $AGL_STORE_TOKEN)",
    )


def store_options(args: argparse.Namespace, url: str) -> dict:
    """The ``open_store`` options for ``url``: the token from ``--store-token``/``--token`` or
    ``--store-token-file`` for an ``http://`` store (none: the client reads ``$AGL_STORE_TOKEN``)."""
    from agl.credentials import read_token

    if not url.startswith(("http://", "https://")):
        return {}
    flag = getattr(args, "token", None) or getattr(args, "store_token", None)
    token = read_token("--store-token", flag, getattr(args, "store_token_file", None))
    return {"token": token} if token else {}
