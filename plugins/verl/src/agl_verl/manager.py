"""verl's TransferQueue agent-loop manager, with agl's worker setup checked in every worker at startup.

verl builds agent loops lazily, one per sample, so a worker whose setup fails (a reward plugin
that cannot be imported there, a store it cannot reach, a missing token) would otherwise fail
each of its samples one by one, and verl would only log them and evict their groups.
:class:`AglAgentLoopManager` (``rollout.agent.agent_loop_manager_class``, which verl's
``TaskRunnerV1`` loads) runs :func:`agl_verl.worker_context.check_worker` inside each of its
agent-loop worker actors as soon as they exist, and raises the first failure: the run stops at
startup with the worker's reason. Imports TransferQueue (through verl's V1 package).
"""

from __future__ import annotations

import asyncio
from typing import Any

from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import AgentLoopManagerTQ

from agl_verl.worker_context import WorkerSetupError, check_worker


def agl_entry(config: Any) -> dict[str, Any]:
    """The ``agl`` entry of the agent-loop file ``config`` names (see ``write_agent_loop_config``)."""
    from agl_verl.distributed import AGENT_LOOP_NAME

    path = config.actor_rollout_ref.rollout.agent.agent_loop_config_path
    if not path:
        raise WorkerSetupError("actor_rollout_ref.rollout.agent.agent_loop_config_path: unset; agl writes it")
    entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    for entry in entries:
        if entry.get("name") == AGENT_LOOP_NAME:
            return entry
    raise WorkerSetupError(f"{path}: no agent loop named {AGENT_LOOP_NAME!r}")


def _check_in_actor(_worker: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """Run inside an agent-loop worker actor (``__ray_call__`` passes the actor first)."""
    return check_worker(entry)


class AglAgentLoopManager(AgentLoopManagerTQ):
    """``AgentLoopManagerTQ`` whose workers set up agl's context (plugins, store, gateway) at startup."""

    async def _init_agent_loop_workers(self) -> None:
        await super()._init_agent_loop_workers()
        entry = agl_entry(self.config)
        self.worker_setups = await asyncio.gather(
            *[worker.__ray_call__.remote(_check_in_actor, entry) for worker in self.agent_loop_workers]
        )
