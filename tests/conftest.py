"""Shared fixtures for the whole suite."""

from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sqlite_store(tmp_path):
    from agl.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "agl.db")
    yield store
    store.close()
