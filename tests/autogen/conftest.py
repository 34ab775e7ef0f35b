"""Fixtures for agl-autogen: a rollout whose spans land in a fresh SQLite store."""

from __future__ import annotations

import pytest

import agl
from agl.capture import BufferedWriter, RolloutContext


class Recorded:
    """A rollout context plus a way to read back what was recorded in it."""

    def __init__(self, store):
        self.store = store
        self.writer = BufferedWriter(store, interval_s=0.05)
        self.ctx = RolloutContext(rollout_id="ro-test", writer=self.writer)

    def spans(self, kind: str | None = None) -> list[agl.Span]:
        self.writer.flush()
        return list(self.store.query_spans(rollout_id=self.ctx.rollout_id, kind=kind))


@pytest.fixture
def recorded(sqlite_store):
    rec = Recorded(sqlite_store)
    with agl.use_rollout(rec.ctx):
        yield rec
    rec.writer.close()


@pytest.fixture
def instrumented():
    import agl_autogen

    agl_autogen.instrument()
    yield
    agl_autogen.uninstrument()


@pytest.fixture
def gateway_rollout(sqlite_store):
    from tests.autogen.gateway_rig import gateway_rollout as rig

    with rig(sqlite_store) as r:
        yield r
