"""The in-process gateway benchmark (tests/benchmarks/bench_gateway_inproc.py): its canned engine
answer is the fake engine's, and a turn measures this checkout's gateway."""

from __future__ import annotations

import argparse

from tests.benchmarks.bench_gateway import BODY
from tests.benchmarks.bench_gateway_inproc import ROOT, engine_answer, one_turn
from tests.fake_engine import FakeEngine


def test_canned_answer_is_the_fake_engines():
    status, answer = FakeEngine().chat(dict(BODY, logprobs=True, return_token_ids=True))
    canned = engine_answer()
    assert status == 200
    for changing in ("id", "created"):
        answer.pop(changing), canned.pop(changing)
    assert canned == answer


def test_a_turn_measures_this_checkouts_gateway():
    args = argparse.Namespace(requests=40, concurrency=4, repeats=2, warmup=10)
    figures = one_turn(ROOT, args)
    assert set(figures) == {"process_us", "loop_thread_us"}
    assert len(figures["process_us"]) == len(figures["loop_thread_us"]) == 2
    assert all(v > 0 for v in figures["process_us"] + figures["loop_thread_us"])
