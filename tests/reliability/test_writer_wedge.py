"""Drill: try to wedge the buffered writer with one bad observation among good ones.

A :class:`BufferedWriter` writes through agl's HTTP client to a real store server on
127.0.0.1. Bad items are built with ``model_construct`` (skipping validation, as an
older or careless client would send them): a span with a NaN start time, an LLM call
whose seq is past 64 bits, a reward of infinity. The good items around them must all
be written, ``flush`` must come back within its timeout, and the writer must keep
writing afterwards.
"""

from __future__ import annotations

import math
import time

import pytest

from agl.capture import BufferedWriter
from agl.capture.writer import DROPPED_SPAN
from agl.credentials import new_token
from agl.schema import LLMCall, Reward, Span
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread


def _span(i: int, rollout_id: str = "ro") -> Span:
    return Span(span_id=f"good-s{i}", rollout_id=rollout_id, name="step", seq=i)


def _call(i: int, rollout_id: str = "ro") -> LLMCall:
    return LLMCall(call_id=f"good-c{i}", rollout_id=rollout_id, seq=i, prompt_ids=[1, 2], response_ids=[3])


def _reward(i: int, rollout_id: str = "ro") -> Reward:
    return Reward(reward_id=f"good-r{i}", rollout_id=rollout_id, value=i / 10, seq=i)


def _bad(item, **fields):
    return type(item).model_construct(**{**item.model_dump(), **fields})


BAD = {
    "span with a NaN start time": lambda: _bad(_span(0), span_id="bad-nan", start_time=math.nan),
    "LLM call with a seq past 64 bits": lambda: _bad(_call(0), call_id="bad-big", seq=2**70),
    "reward of infinity": lambda: _bad(_reward(0), reward_id="bad-inf", value=math.inf),
}


@pytest.fixture
def served(tmp_path):
    token = new_token(16)
    backing = SqliteStore(tmp_path / "agl.db")
    with ServerThread(backing, token=token, expire_every_s=None) as server:
        client = HttpStore(server.url, token=token, retries=2, backoff_s=0.05)
        yield backing, client
        client.close()
    backing.close()


@pytest.mark.parametrize("bad", sorted(BAD))
def test_one_bad_observation_does_not_wedge_the_writer(served, bad):
    backing, client = served
    writer = BufferedWriter(client, batch_size=64, interval_s=0.05, retry_for_s=30)
    try:
        for i in range(1, 31):
            writer.put(_span(i))
            writer.put(_call(i))
            writer.put(_reward(i))
            if i == 17:
                writer.put(BAD[bad]())  # in the middle of a batch
        started = time.monotonic()
        writer.flush(timeout_s=10)
        assert time.monotonic() - started < 10
        assert sum(writer.dropped.values()) == 1, writer.dropped

        for i in range(31, 41):  # later writes still go through
            writer.put(_span(i))
            writer.put(_call(i))
            writer.put(_reward(i))
        writer.flush(timeout_s=10)
    finally:
        writer.close(timeout_s=10)

    spans = [s for s in backing.query_spans(rollout_id="ro") if s.name != DROPPED_SPAN]
    assert sorted(s.span_id for s in spans) == sorted(f"good-s{i}" for i in range(1, 41))
    assert sorted(c.call_id for c in backing.query_llm_calls(rollout_id="ro")) == sorted(
        f"good-c{i}" for i in range(1, 41)
    )
    assert sorted(r.reward_id for r in backing.query_rewards(rollout_id="ro")) == sorted(
        f"good-r{i}" for i in range(1, 41)
    )
    markers = [s for s in backing.query_spans(rollout_id="ro") if s.name == DROPPED_SPAN]
    assert markers, "the drop is not recorded on the rollout"
