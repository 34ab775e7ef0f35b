"""A rollout served by the real agl gateway in front of the fake engine, for the integration tests.

Used by tests/autogen, tests/openai_agents and tests/otel: the store knows the rollout,
the agent's spans go through a BufferedWriter into the same store, and
:meth:`GatewayRollout.transitions` ends the rollout and builds its transitions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import agl
from agl.capture import BufferedWriter, RolloutContext
from agl.schema import Rollout, RolloutStatus, Task
from agl_trainer.gateway import Gateway
from tests.fake_engine import FakeEngine

TOKEN = "test-token"


class GatewayRollout:
    def __init__(self, store, gateway: Gateway, rollout_id: str):
        self.store = store
        self.gateway = gateway
        self.rollout_id = rollout_id
        self.base_url = gateway.rollout_base_url(rollout_id)
        self.writer = BufferedWriter(store, interval_s=0.05)
        self.key = gateway.rollout_key(rollout_id, store.get_rollout(rollout_id).attempt)  # the agent's only key
        self.ctx = RolloutContext(rollout_id=rollout_id, base_url=self.base_url, api_key=self.key, writer=self.writer)

    def spans(self, kind: str | None = None) -> list[agl.Span]:
        self.writer.flush()
        return list(self.store.query_spans(rollout_id=self.rollout_id, kind=kind))

    def calls(self) -> list[agl.LLMCall]:
        self.gateway.flush()
        return list(self.store.query_llm_calls(rollout_id=self.rollout_id))

    def transitions(self):
        from agl_trainer.transitions import build_transitions

        self.writer.flush()
        self.gateway.flush()
        self.store.finish(self.rollout_id, RolloutStatus.SUCCEEDED)
        return build_transitions(self.store, [self.store.get_rollout(self.rollout_id)])


@contextlib.contextmanager
def gateway_rollout(store) -> Iterator[GatewayRollout]:
    """Engine, gateway and one running rollout; the rollout is current inside the block."""
    store.add_tasks([Task(task_id="task-1", input={"q": "x"})])
    store.enqueue([Rollout(rollout_id="ro-gw", task_id="task-1")])
    store.claim("runner-test")
    with FakeEngine() as engine:
        gateway = Gateway(store, [engine.url], token=TOKEN, model_version="v1").start()
        try:
            rig = GatewayRollout(store, gateway, "ro-gw")
            with agl.use_rollout(rig.ctx):
                yield rig
            rig.writer.close()
        finally:
            gateway.stop()
