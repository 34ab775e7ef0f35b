"""The SQL agent's checker measured from its recorded calls: acceptance, accuracy against the
execution match of the query it was shown, and its acceptance of right and of wrong queries.

The agent's own LangGraph graph runs under the LangChain callback handler into a real SQLite
store, so the spans read are the records a training run leaves. Its chat models are
langchain-core's scripted fakes: the verdicts must be chosen, which no model here would give.
"""

from __future__ import annotations

import pytest

from tests.examples.modules import example_modules

GOLD = "SELECT Name FROM Artist WHERE ArtistId = 1"
WRONG = "SELECT Name FROM Artist WHERE ArtistId = 2"


@pytest.fixture(scope="module")
def sql():
    return example_modules("sql_agent", "agent", "evaluation", "prompts")


def fenced(query: str) -> str:
    return f"```sql\n{query}\n```"


SCRIPTS = {
    # rollout: (the writer's and rewriter's answers, the checker's verdicts)
    "ro-right-accepted": ([fenced(GOLD)], ["YES"]),
    "ro-wrong-accepted": ([fenced(WRONG)], ["Yes, it does."]),
    # rejects a wrong query (right), then the right one (wrong), then no query at all (right)
    "ro-three-rounds": ([fenced(WRONG), fenced(GOLD), "I cannot write that."], ["NO, wrong id.", "NO", "NO, none."]),
}


@pytest.fixture
def recorded(sql, tmp_path):
    """A store holding the spans of the three scripted rollouts, and their Rollout records."""
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    import agl
    from agl.capture import BufferedWriter
    from agl.schema import Rollout, RolloutStatus, Span
    from agl.store.sqlite import SqliteStore
    from agl_langchain import AglCallbackHandler

    def scripted(replies: list[str]) -> GenericFakeChatModel:
        return GenericFakeChatModel(messages=iter(AIMessage(r) for r in replies))

    store = SqliteStore(tmp_path / "agl.db")
    writer = BufferedWriter(store, interval_s=0.05)
    rollouts = []
    try:
        for rollout_id, (answers, verdicts) in SCRIPTS.items():
            graph = sql.agent.build_graph(scripted(answers), scripted(verdicts))
            with agl.use_rollout(agl.RolloutContext(rollout_id=rollout_id, writer=writer)):
                state = graph.invoke({"question": "Who is artist 1?"}, config={"callbacks": [AglCallbackHandler()]})
            output = {"sql": state["sql"], "accepted": state["accepted"], "rounds": state["rounds"]}
            rollouts.append(Rollout(rollout_id=rollout_id, task_id="t", status=RolloutStatus.SUCCEEDED, output=output))
        # a checker call that failed: no verdict recorded
        attributes = {"gen_ai.agent.name": "check_query", "gen_ai.input.messages": [{"role": "user", "content": "x"}]}
        writer.put(
            Span(rollout_id="ro-wrong-accepted", name="ChatOpenAI", kind="llm", status="error", attributes=attributes)
        )
        writer.flush()
        yield store, rollouts
    finally:
        writer.close()
        store.close()


def test_the_checker_is_scored_on_each_query_it_was_shown(sql, recorded):
    store, rollouts = recorded
    tasks = {"t": {"gold_sql": GOLD, "tier": "easy"}}

    summary = sql.evaluation.summarize(rollouts, tasks, store)

    assert summary["agent_calls"]["check_query"] == 6  # five checks and the failed call
    # checks: right accepted, wrong accepted, wrong rejected, right rejected, no query rejected
    assert summary["checker"] == {
        "checks": 5,
        "acceptance": 2 / 5,
        "accuracy": 3 / 5,
        "right_queries": 2,
        "acceptance_of_right": 1 / 2,
        "acceptance_of_wrong": 1 / 3,
        "unread": 1,
    }
    assert summary["checker_acceptance"] == 2 / 5  # the agent's own count agrees on the five checks


def test_a_checker_that_saw_no_right_query_has_no_acceptance_of_right_ones(sql, recorded):
    store, rollouts = recorded
    only_wrong = [r for r in rollouts if r.rollout_id == "ro-wrong-accepted"]
    figures = sql.evaluation.checker_figures(store, only_wrong, {"t": {"gold_sql": GOLD}})
    assert figures["checks"] == 1 and figures["right_queries"] == 0
    assert figures["acceptance_of_right"] is None and figures["acceptance_of_wrong"] == 1.0
    assert figures["accuracy"] == 0.0 and figures["unread"] == 1


def test_the_checked_query_is_read_back_from_the_checkers_message(sql):
    prompts = sql.prompts
    shown = prompts.checker_messages("How many?\nAll of them?", "SELECT 1\nFROM Track")[-1][1]
    assert prompts.checked_query(shown) == "SELECT 1\nFROM Track"
    assert prompts.checked_query(prompts.checker_messages("How many?", prompts.NO_QUERY)[-1][1]) == ""
    assert prompts.checked_query("Does this look right?") is None
