"""The call id order benchmark (tests/benchmarks/bench_call_id_order.py): its records are the
gateway's record of the benchmark's call, and a turn times writes of every one of them."""

from __future__ import annotations

from agl_trainer.gateway.call_ids import new_call_id
from tests.benchmarks.bench_call_id_order import KINDS, one_turn, records


def test_records_are_the_benchmarks_call_as_recorded():
    ids = [new_call_id("chatcmpl-") for _ in range(3)]
    calls = records(ids)
    assert [c.call_id for c in calls] == ids
    first = calls[0]
    assert len(first.prompt_ids) > 0 and len(first.response_ids) == len(first.response_logprobs) > 0
    assert "prompt_token_ids" not in first.response  # stripped, as the gateway records it
    assert first.response["choices"][0]["logprobs"] is None


def test_each_kind_makes_distinct_ids_and_a_turn_times_four_quarters():
    for kind, make in KINDS.items():
        assert len({make() for _ in range(100)}) == 100, kind
        quarters = one_turn(kind, 40, 8)
        assert len(quarters) == 4 and all(q > 0 for q in quarters)
