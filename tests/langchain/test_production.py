"""Outside a training rollout: production traces, rewarded later by run id."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.tracers.context import collect_runs

import agl.capture.context
from agl_langchain import AglCallbackHandler, reward_run
from tests.langchain.fakes import fake_model
from tests.langchain.test_graph import writer_graph


@pytest.fixture
def production(cap, monkeypatch):
    """Point the production writer (normally opened from AGL_STORE_URL) at the test store."""
    monkeypatch.setattr(agl.capture.context, "_production_writer", cap.writer)
    return cap


def test_production_traces_and_later_feedback(production):
    cap = production
    run_id = uuid.uuid4()
    handler = AglCallbackHandler()
    graph = writer_graph(fake_model(["a draft", "good", "another", "good"]))
    graph.invoke({"topic": "owls"}, config={"callbacks": [handler], "run_id": run_id})
    with collect_runs() as runs:
        graph.invoke({"topic": "bats"}, config={"callbacks": [handler]})
    second_run = next(r.id for r in runs.traced_runs if r.name == "LangGraph")

    spans = cap.spans(None)
    assert spans and all(s.rollout_id is None for s in spans)
    first = [s for s in spans if s.trace_id == str(run_id)]
    second = [s for s in spans if s.trace_id == str(second_run)]
    assert len(first) == len(second) == len(spans) // 2, "each top-level run is its own trace"
    (root,) = [s for s in first if s.parent_id is None]
    assert root.span_id == str(run_id)

    # user feedback arrives later, by run id; a judge scores one LLM call by span id
    reward_run(run_id, 1.0)
    llm = next(s for s in second if s.kind == "llm")
    reward_run(llm.span_id, -1.0, name="judge", source="judge", store=cap.store)

    rewards = {r.span_id: r for r in cap.rewards(None)}
    assert rewards[str(run_id)].value == 1.0 and rewards[str(run_id)].source == "user"
    assert rewards[llm.span_id].name == "judge" and rewards[llm.span_id].rollout_id is None
    span_ids = {s.span_id for s in spans}
    assert set(rewards) <= span_ids


def test_reward_run_rejects_bad_input():
    with pytest.raises(ValueError, match="value"):
        reward_run(uuid.uuid4(), "good")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run_id"):
        reward_run("not-a-run", 1.0)
