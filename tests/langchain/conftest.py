"""Fixtures for the agl-langchain tests: a real SQLite store behind a real buffered writer."""

from __future__ import annotations

import pytest

import agl
from agl.capture import BufferedWriter
from agl.schema import Reward, Span
from agl.store.sqlite import SqliteStore


class Captured:
    """A store, its writer and one training rollout, with readers that flush first."""

    def __init__(self, store: SqliteStore, writer: BufferedWriter):
        self.store = store
        self.writer = writer
        self.ctx = agl.RolloutContext(rollout_id="ro-test", writer=writer)

    def spans(self, rollout_id: str | None = "ro-test", kind: str | None = None) -> list[Span]:
        self.writer.flush()
        if rollout_id is None:
            return list(self.store.query_spans(production=True, kind=kind))
        return list(self.store.query_spans(rollout_id=rollout_id, kind=kind))

    def rewards(self, rollout_id: str | None = "ro-test") -> list[Reward]:
        self.writer.flush()
        if rollout_id is None:
            return list(self.store.query_rewards(production=True))
        return list(self.store.query_rewards(rollout_id=rollout_id))

    def by_id(self, rollout_id: str | None = "ro-test") -> dict[str, Span]:
        return {s.span_id: s for s in self.spans(rollout_id)}


@pytest.fixture
def cap(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    writer = BufferedWriter(store, interval_s=0.05)
    yield Captured(store, writer)
    writer.close()
    store.close()
