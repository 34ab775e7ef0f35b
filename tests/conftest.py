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


@pytest.fixture
async def openai_client():
    """Makes ``AsyncOpenAI`` clients (no retries) and closes them when the test ends, on its own loop.

    An unclosed client is closed by the garbage collector on whatever loop runs then, which
    logs a "Task exception was never retrieved" (``Event loop is closed``) into a later test.
    """
    from openai import AsyncOpenAI

    made: list[AsyncOpenAI] = []

    def make(base_url: str, api_key: str, **options) -> AsyncOpenAI:
        made.append(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, **options))
        return made[-1]

    yield make
    for client in made:
        await client.close()


@pytest.fixture(autouse=True)
def _plugins_registered_by_a_test_end_with_it():
    """Unregister every agl plugin a test registered (an example's ``train.main`` registers its reward
    plugin for the process, as a user's script does): a reward plugin left behind would score the
    rollouts of every later test."""
    from agl.plugins import get_plugin_manager

    before = {name for name, _ in get_plugin_manager().list_name_plugin()}
    yield
    pm = get_plugin_manager()
    for name, plugin in pm.list_name_plugin():
        if name not in before and plugin is not None:
            pm.unregister(name=name)
