"""Fixtures: a fake engine (a test double for a model, see tests/fake_engine.py), a real SQLite
store, and the gateway in front of them on 127.0.0.1.

To run these tests against a real engine, start it and point ``engine_url`` at it; the
tests that depend on the fake's byte-level "model" say so by using ``render_chat``.
"""

from __future__ import annotations

import openai
import pytest

from agl.schema import Rollout, Task
from agl_trainer.gateway import Gateway
from tests.fake_engine import FakeEngine

TOKEN = "test-token"
ADMIN_TOKEN = "test-admin-token"


@pytest.fixture
def engine():
    with FakeEngine() as eng:
        yield eng


@pytest.fixture
def store(sqlite_store):
    sqlite_store.add_tasks([Task(task_id="task-1", input={"q": "x"})])
    return sqlite_store


def new_rollout(store, rollout_id: str = "ro-1") -> str:
    """Enqueue a rollout and claim it (a rollout key works only while its attempt runs)."""
    store.enqueue([Rollout(rollout_id=rollout_id, task_id="task-1")])
    assert [r.rollout_id for r in store.claim(f"runner-{rollout_id}", limit=1)] == [rollout_id]
    return rollout_id


def key_of(gateway, store, rollout_id: str) -> str:
    """The rollout key of the running attempt of ``rollout_id``: what its agent gets as api key."""
    return gateway.rollout_key(rollout_id, store.get_rollout(rollout_id).attempt)


@pytest.fixture
def rollout(store) -> str:
    return new_rollout(store)


@pytest.fixture
def gateway(store, engine):
    gw = Gateway(store, [engine.url], token=TOKEN, admin_token=ADMIN_TOKEN, model_version="v1").start()
    yield gw
    gw.stop()


@pytest.fixture
def key(gateway, store, rollout) -> str:
    return key_of(gateway, store, rollout)


@pytest.fixture
def client(gateway, rollout, key) -> openai.OpenAI:
    """The real openai client, pointed at the gateway for one rollout with that rollout's key."""
    with openai.OpenAI(base_url=gateway.rollout_base_url(rollout), api_key=key, max_retries=0) as c:
        yield c


def calls_of(gateway, store, rollout_id):
    gateway.flush()
    return list(store.query_llm_calls(rollout_id=rollout_id))
