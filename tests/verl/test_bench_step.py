"""The step benchmark's fixtures and replay (tests/benchmarks/bench_step.py) on a tiny model.

The committed calculator-agent fixture is replayed on the tiny engine, its token ids folded into
the tiny vocabulary: every recorded call is sent, with its prompt and its response length.
"""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from tests.benchmarks.step_fixtures import (
    StepFixture,
    completion_body,
    fixture_path,
    fixtures_of,
    load_fixture,
    write_fixture,
)
from tests.benchmarks.step_replay import measure_engine, started_engine


@pytest.fixture(scope="module")
def calc_fixture() -> StepFixture:
    paths = fixtures_of("calc_agent")
    assert paths, "no committed calc_agent fixture in tests/benchmarks/data/steps"
    return load_fixture(paths[0])


def test_fixture_holds_the_steps_calls_and_transitions(calc_fixture):
    assert calc_fixture.agent == "calc_agent"
    assert len(calc_fixture.rollouts) == 24  # 3 problems x 8 rollouts
    assert all(len(rollout) >= 1 for rollout in calc_fixture.rollouts)
    transitions = calc_fixture.build_transitions()
    assert transitions and len(transitions) <= len(calc_fixture.calls)
    recorded = {(tuple(c.prompt_ids), tuple(c.response_ids)) for c in calc_fixture.calls}
    for t in transitions:
        assert (tuple(t.prompt_ids), tuple(t.response_ids)) in recorded
        assert t.response_logprobs is not None and len(t.response_logprobs) == len(t.response_ids)
    assert calc_fixture.measured["time_step_s"] > 0
    assert 0 < calc_fixture.settings["temperature"] <= 1


def test_completion_body_redoes_the_calls_work(calc_fixture):
    call = calc_fixture.calls[0]
    body = completion_body(call, "m")
    assert body["prompt"] == call.prompt_ids
    assert body["max_tokens"] == len(call.response_ids)
    assert body["ignore_eos"] is True and body["temperature"] == call.temperature


def test_load_names_a_fixture_in_another_format(tmp_path, calc_fixture):
    path = write_fixture(dataclasses.replace(calc_fixture, step=99), tmp_path)
    assert path == fixture_path("calc_agent", 99, tmp_path)
    assert load_fixture(path).calls == calc_fixture.calls
    body = json.loads(gzip.decompress(path.read_bytes()))
    body["format"] = 0
    path.write_bytes(gzip.compress(json.dumps(body).encode()))
    with pytest.raises(ValueError, match="format: expected 1, got 0"):
        load_fixture(path)


@pytest.mark.timeout(180)
def test_replay_sends_every_call_with_its_token_counts(tiny_model_dir, calc_fixture):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    fold = [
        [dataclasses.replace(c, prompt_ids=[t % vocab for t in c.prompt_ids]) for c in rollout]
        for rollout in calc_fixture.rollouts
    ]
    fixture = dataclasses.replace(calc_fixture, rollouts=fold)
    with started_engine(tiny_model_dir, None, max_model_len=1024) as engine:
        run = measure_engine(engine, fixture, concurrency=16)
    expected = [[(len(c.prompt_ids), max(1, len(c.response_ids))) for c in rollout] for rollout in fold]
    assert run.counts == expected
    assert run.generated == sum(g for rollout in expected for _, g in rollout)
    assert run.wall_s > 0
    # the engine's counters cover the replay and nothing else; a group's 8 rows share their prompt
    assert run.counters["prompt_tokens"] == fixture.prompt_tokens()
    assert run.counters["generated_tokens"] == run.generated
    assert run.counters["prompt_tokens_computed"] + run.counters["prompt_tokens_cached"] == fixture.prompt_tokens()
    assert run.counters["prompt_tokens_computed"] < fixture.prompt_tokens() / 4
