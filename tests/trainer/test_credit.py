"""Credit assignment on hand-built rollouts: each strategy, normalization, multi-agent selection."""

from __future__ import annotations

import pytest

from agl.errors import ConfigError
from agl.hookspecs import hookimpl
from agl.plugins import register, resolve, unregister
from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span, Task
from agl_trainer.credit import RolloutRewards, broadcast, discounted, emitted, last
from agl_trainer.transitions import TransitionConfig, build_transitions


def test_broadcast_gives_every_call_the_final_reward():
    assert broadcast(3, RolloutRewards(final=0.7)) == [0.7, 0.7, 0.7]
    assert broadcast(0, RolloutRewards(final=1.0)) == []


def test_last_rewards_only_the_final_call():
    assert last(3, RolloutRewards(final=2.0)) == [0.0, 0.0, 2.0]
    assert last(1, RolloutRewards(final=2.0)) == [2.0]
    assert last(0, RolloutRewards(final=2.0)) == []


def test_discounted_decays_gamma_per_step_back():
    assert discounted(4, RolloutRewards(final=1.0), gamma=0.5) == [0.125, 0.25, 0.5, 1.0]
    assert discounted(2, RolloutRewards(final=-1.0), gamma=1.0) == [-1.0, -1.0]
    with pytest.raises(ValueError, match="gamma: must be between 0 and 1"):
        discounted(2, RolloutRewards(final=1.0), gamma=1.5)


def test_emitted_is_returns_to_go_of_intermediate_rewards_plus_the_final():
    # call 0 earns +1 (after it), call 1 earns -0.5, the final reward is 2.
    rewards = RolloutRewards(final=2.0, emitted=[(0, 1.0), (1, -0.5)])
    assert emitted(3, rewards) == [2.5, 1.5, 2.0]
    assert emitted(3, rewards, gamma=0.5) == [1.0 + 0.5 * (-0.5 + 0.5 * 2.0), -0.5 + 0.5 * 2.0, 2.0]
    # a reward before any call counts for the first; one past the end for the last
    assert emitted(2, RolloutRewards(final=0.0, emitted=[(-1, 1.0), (5, 3.0)])) == [4.0, 3.0]
    assert emitted(0, rewards) == []


def test_strategies_resolve_through_the_registry_and_plugins_can_add_one():
    assert resolve("credit_assignment", "emitted") is emitted

    class Halves:
        @staticmethod
        @hookimpl
        def agl_register_credit_assignments(register):
            register("halves", lambda n, rewards, **_: [rewards.final / 2] * n)

    register(Halves, name="halves")
    try:
        assert resolve("credit_assignment", "halves")(2, RolloutRewards(final=1.0)) == [0.5, 0.5]
    finally:
        unregister(name="halves")
    with pytest.raises(ConfigError, match="no plugin provides 'halves'"):
        resolve("credit_assignment", "halves")


def _provider(strategy_name, value, **opts):
    class Provider:
        @staticmethod
        @hookimpl(**opts)
        def agl_register_credit_assignments(register):
            register(strategy_name, lambda n, rewards, **_: [value] * n)

    return Provider


def test_strategies_are_asked_in_relay_order():
    register(_provider("x", 1.0, tryfirst=True), name="first")
    register(_provider("x", 2.0), name="later")  # pluggy asks the last registered first, unless marked
    register(_provider("broadcast", 42.0), name="my-broadcast")
    try:
        assert resolve("credit_assignment", "x")(2, RolloutRewards(final=0.0)) == [1.0, 1.0]
        # The built-ins register trylast: a plugin can provide a strategy of the same name.
        assert resolve("credit_assignment", "broadcast")(2, RolloutRewards(final=1.0)) == [42.0, 42.0]
        assert resolve("credit_assignment", "last") is last
    finally:
        for name in ("first", "later", "my-broadcast"):
            unregister(name=name)
    assert resolve("credit_assignment", "broadcast") is broadcast


def _multi_agent_rollout(store, rid, agents, final, emitted_after=None):
    """A rollout whose calls are made by ``agents`` in order, one second apart."""
    store.add_tasks([Task(task_id=f"task-{rid}", input={})])
    store.enqueue([Rollout(rollout_id=rid, task_id=f"task-{rid}")])
    store.claim("r", limit=10)
    for i, agent in enumerate(agents):
        store.add_llm_calls(
            [
                LLMCall(
                    call_id=f"{rid}-c{i}", rollout_id=rid, seq=i, prompt_ids=[1], response_ids=[2], created_at=100.0 + i
                )
            ]
        )
        store.add_spans(
            [
                Span(
                    span_id=f"{rid}-s{i}",
                    rollout_id=rid,
                    seq=i,
                    name="chat",
                    kind="llm",
                    end_time=100.0 + i,
                    attributes={"gen_ai.response.id": f"{rid}-c{i}", "gen_ai.agent.name": agent},
                )
            ]
        )
    for index, value in emitted_after or []:
        store.add_rewards([Reward(rollout_id=rid, name="step", value=value, created_at=100.0 + index + 0.5)])
    store.add_rewards([Reward(rollout_id=rid, value=final, created_at=200.0)])
    return store.finish(rid, RolloutStatus.SUCCEEDED)


def test_multi_agent_selection_and_rollout_normalization(sqlite_store):
    # A write/check loop: the writer makes 3 calls, the checker 2; then a short one with 1 writer call.
    long = _multi_agent_rollout(sqlite_store, "long", ["writer", "checker", "writer", "checker", "writer"], 1.0)
    short = _multi_agent_rollout(sqlite_store, "short", ["writer"], 0.0)
    ts, report = build_transitions(sqlite_store, [long, short], TransitionConfig(agents=["writer"]))
    assert [(t.rollout_id, t.agent) for t in ts] == [("long", "writer")] * 3 + [("short", "writer")]
    # each rollout weighs 1 in its group, however many of its calls were kept
    weights: dict[str, float] = {}
    for t in ts:
        weights[t.rollout_id] = weights.get(t.rollout_id, 0) + t.weight
    assert weights == pytest.approx({"long": 1.0, "short": 1.0})
    assert report.filtered_out == 2
    ts, _ = build_transitions(sqlite_store, [long], TransitionConfig(agents=["checker"], credit="last"))
    assert [t.reward for t in ts] == [0.0, 0.0]  # the last call was the writer's
    ts, _ = build_transitions(sqlite_store, [long], TransitionConfig(agents=["nobody"]))
    assert ts == []


def test_emitted_credit_on_a_multi_agent_rollout(sqlite_store):
    # The checker's verdicts are intermediate rewards: +1 after call 1, -1 after call 3.
    r = _multi_agent_rollout(
        sqlite_store, "r", ["writer", "checker", "writer", "checker"], 2.0, emitted_after=[(1, 1.0), (3, -1.0)]
    )
    ts, _ = build_transitions(sqlite_store, [r], TransitionConfig(credit="emitted", normalize="none"))
    assert [t.reward for t in ts] == [2.0, 2.0, 1.0, 1.0]
    cfg = TransitionConfig(credit="emitted", agents=["writer"], normalize="none")
    ts, _ = build_transitions(sqlite_store, [r], cfg)
    assert [(t.step, t.reward) for t in ts] == [(0, 2.0), (2, 1.0)]
