"""Agent names are the participants' names, with no per-run suffix (SelectorGroupChat)."""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import SelectorGroupChat
from autogen_ext.models.replay import ReplayChatCompletionClient

from agl_autogen._record import runtime_agent_name
from tests.autogen.test_replay import MODEL_INFO


def selector_team() -> SelectorGroupChat:
    """A planner and a coder; the manager's own model picks who speaks."""
    planner = AssistantAgent(
        "planner",
        model_client=ReplayChatCompletionClient(["the plan"], model_info=MODEL_INFO),
        description="Plans the work.",
    )
    coder = AssistantAgent(
        "coder",
        model_client=ReplayChatCompletionClient(["the code"], model_info=MODEL_INFO),
        description="Writes the code.",
    )
    return SelectorGroupChat(
        [planner, coder],
        model_client=ReplayChatCompletionClient(["planner", "coder"], model_info=MODEL_INFO),
        termination_condition=MaxMessageTermination(3),
        allow_repeated_speaker=True,  # so the manager asks its model at every turn
    )


async def test_selector_group_chat_names_are_stable(recorded, instrumented):
    runs = []
    for _ in range(2):  # two teams: two team ids, the same names
        result = await selector_team().run(task="write a script")
        assert [m.source for m in result.messages] == ["user", "planner", "coder"]
        runs.append(len(recorded.spans("llm")))
    llm = recorded.spans("llm")
    assert len(llm) == runs[1] == 2 * runs[0] == 8
    names = [s.attributes["gen_ai.agent.name"] for s in llm]
    assert names == ["SelectorGroupChatManager", "planner", "SelectorGroupChatManager", "coder"] * 2
    # the per-run team id stays in the agent id, never in the name
    team_ids = {s.attributes["gen_ai.agent.id"].rsplit("/", 1)[1] for s in llm}
    assert len(team_ids) == 2
    assert not any(team_id in name for team_id in team_ids for name in names)


def test_runtime_agent_name():
    assert runtime_agent_name("SelectorGroupChatManager_ab-12", "ab-12") == "SelectorGroupChatManager"
    assert runtime_agent_name("planner_ab-12", "ab-12") == "planner"
    # a core runtime's own agent types are kept as they are
    assert runtime_agent_name("PlayerWhite", "default") == "PlayerWhite"
    assert runtime_agent_name("_default", "default") == "_default"
