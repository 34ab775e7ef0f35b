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
