"""The langgraph-supervisor quickstart's shape: calls carry the names the user gave.

A supervisor (``create_supervisor``) hands off to two named workers, one built
with ``create_react_agent(name="math_expert")`` and one with
``create_agent(name="research_expert")``. Every LLM call is made by an inner node
called ``agent`` or ``model``; the agent recorded is the user's name, and
``TransitionConfig(agents=[...])`` selects exactly one worker's calls.
"""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from langgraph_supervisor import create_supervisor

import agl
from agl.schema import Rollout, RolloutStatus, Task
from agl_langchain import AglCallbackHandler
from agl_trainer.transitions import TransitionConfig, build_transitions
from tests.langchain.fakes import ToolCallingFakeModel, fake_model, tool_call


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@tool
def web_search(query: str) -> str:
    """Search the web for information."""
    return "Meta 67,317; Apple 164,000; Amazon 1,551,000; Netflix 14,000; Google 181,269"


def supervisor_app(name: str | None = None):
    """The quickstart's supervisor with two workers, each driven by its own fake model."""
    research_model = fake_model([tool_call("web_search", {"query": "FAANG headcount 2024"}, "r1"), "headcounts found"])
    math_model = fake_model(
        [
            tool_call("add", {"a": 67317, "b": 164000}, "m1"),
            tool_call("add", {"a": 231317, "b": 1551000}, "m2"),
            "the total is 1782317",
        ]
    )
    supervisor_model = fake_model(
        [
            tool_call("transfer_to_research_expert", {}, "s1"),
            tool_call("transfer_to_math_expert", {}, "s2"),
            "The combined headcount is 1782317.",
        ]
    )
    research_agent = create_agent(
        research_model, tools=[web_search], name="research_expert", system_prompt="You are a world class researcher."
    )
    math_agent = create_react_agent(
        math_model, tools=[add, multiply], name="math_expert", prompt="You are a math expert."
    )
    workflow = create_supervisor(
        [research_agent, math_agent],
        model=supervisor_model,
        prompt="You manage a research expert and a math expert.",
    )
    return workflow.compile(name=name)


@pytest.fixture
def finished_run(cap):
    """Run the supervisor inside a claimed rollout; return the finished rollout."""
    cap.store.add_tasks([Task(task_id="task-sup", input={})])
    cap.store.enqueue([Rollout(rollout_id="ro-test", task_id="task-sup")])
    (claimed,) = cap.store.claim("runner-sup")
    question = {"role": "user", "content": "what's the combined headcount of the FAANG companies in 2024?"}
    with agl.use_rollout(cap.ctx):
        out = supervisor_app().invoke({"messages": [question]}, config={"callbacks": [AglCallbackHandler()]})
        agl.emit_reward(1.0)
    assert out["messages"][-1].content == "The combined headcount is 1782317."
    cap.writer.flush()
    return cap.store.finish(claimed.rollout_id, RolloutStatus.SUCCEEDED, output="done")


def test_each_call_carries_the_users_agent_name(cap, finished_run):
    llm = sorted(cap.spans(kind="llm"), key=lambda s: s.seq)
    agents = [s.attributes["gen_ai.agent.name"] for s in llm]
    assert agents == [
        "supervisor",
        "research_expert",
        "research_expert",
        "supervisor",
        "math_expert",
        "math_expert",
        "math_expert",
        "supervisor",
    ]
    # the inner node each call ran in is kept apart from the agent
    nodes = {(s.attributes["gen_ai.agent.name"], s.attributes["agl.langgraph.node"]) for s in llm}
    assert nodes == {("supervisor", "agent"), ("research_expert", "model"), ("math_expert", "agent")}
    tools = {s.attributes["gen_ai.tool.name"]: s.attributes["gen_ai.agent.name"] for s in cap.spans(kind="tool")}
    assert tools["web_search"] == "research_expert" and tools["add"] == "math_expert"
    assert tools["transfer_to_math_expert"] == "supervisor"


@pytest.mark.parametrize(
    ("agents", "expected"),
    [
        (["math_expert"], ["math_expert"] * 3),
        (["supervisor"], ["supervisor"] * 3),
        (["research_expert", "math_expert"], ["research_expert"] * 2 + ["math_expert"] * 3),
    ],
)
def test_transitions_select_exactly_the_named_agents(cap, finished_run, agents, expected):
    ts, report = build_transitions(cap.store, [finished_run], TransitionConfig(agents=agents))
    assert [t.agent for t in ts] == expected
    assert all(t.reward == 1.0 for t in ts)
    assert report.filtered_out == 8 - len(expected)
    if agents == ["math_expert"]:
        # the worker's own conversation, not the supervisor's: its system prompt opens every prompt
        assert all(t.prompt_messages[0] == {"role": "system", "content": "You are a math expert."} for t in ts)


def test_a_named_top_level_agent_is_its_own_agent(cap):
    solo = create_react_agent(fake_model(["4"]), tools=[add], name="calculator")
    with agl.use_rollout(cap.ctx):
        solo.invoke({"messages": [{"role": "user", "content": "2+2?"}]}, config={"callbacks": [AglCallbackHandler()]})
    (span,) = cap.spans(kind="llm")
    assert span.attributes["gen_ai.agent.name"] == "calculator"
    assert span.attributes["agl.langgraph.node"] == "agent"


def test_a_subagent_called_from_a_tool_is_its_own_agent(cap):
    researcher = create_agent(fake_model(["42"]), tools=[], name="researcher")

    @tool
    def ask_researcher(question: str) -> str:
        """Ask the researcher."""
        return researcher.invoke({"messages": [{"role": "user", "content": question}]})["messages"][-1].content

    boss = create_agent(
        fake_model([tool_call("ask_researcher", {"question": "x"}, "c1"), "done"]), tools=[ask_researcher], name="boss"
    )
    with agl.use_rollout(cap.ctx):
        boss.invoke({"messages": [{"role": "user", "content": "hi"}]}, config={"callbacks": [AglCallbackHandler()]})
    llm = sorted(cap.spans(kind="llm"), key=lambda s: s.seq)
    # the subagent runs inside the boss's "tools" node: the agent is its own name, not "tools"
    assert [s.attributes["gen_ai.agent.name"] for s in llm] == ["boss", "researcher", "boss"]
    (tool_span,) = cap.spans(kind="tool")
    assert tool_span.attributes["gen_ai.agent.name"] == "boss"


def test_a_failed_call_keeps_its_agent_and_request(cap):
    class Down(Exception):
        pass

    class FailingModel(ToolCallingFakeModel):
        def _generate(self, *args, **kwargs):
            raise Down("model down")

    worker = create_react_agent(FailingModel(messages=iter([])), tools=[add], name="math_expert")
    with agl.use_rollout(cap.ctx), pytest.raises(Down):
        worker.invoke({"messages": [{"role": "user", "content": "1+1?"}]}, config={"callbacks": [AglCallbackHandler()]})
    (span,) = cap.spans(kind="llm")
    assert span.status == "error" and span.attributes["error.message"] == "model down"
    assert span.attributes["gen_ai.agent.name"] == "math_expert"
    assert span.attributes["gen_ai.input.messages"] == [{"role": "user", "content": "1+1?"}]
    assert [t["function"]["name"] for t in span.attributes["gen_ai.tool.definitions"]] == ["add"]


def test_naming_the_whole_app_keeps_the_workers_names(cap):
    app = supervisor_app(name="faang_team")
    question = {"role": "user", "content": "what's the combined headcount?"}
    with agl.use_rollout(cap.ctx):
        app.invoke({"messages": [question]}, config={"callbacks": [AglCallbackHandler()]})
    llm = sorted(cap.spans(kind="llm"), key=lambda s: s.seq)
    assert {s.attributes["gen_ai.agent.name"] for s in llm} == {"supervisor", "research_expert", "math_expert"}
    top = [s for s in cap.spans(kind="agent") if s.parent_id is None]
    assert [s.name for s in top] == ["faang_team"]
