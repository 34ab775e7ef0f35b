"""The runner a training run starts in its own process (``rollout.runners: inprocess``)."""

from __future__ import annotations

import threading
from typing import Any

from agl.runner import Agent, Runner
from agl.store.base import Store
from agl_trainer.config import TrainerConfig


def start_inprocess_runner(
    config: TrainerConfig,
    agent: Agent,
    store: Store,
    *,
    gateway_url: str,
    api_key: str | None,
    rollout_keys: Any,
    writer: Any,
) -> tuple[Runner, threading.Thread]:
    """A :class:`~agl.runner.Runner` of ``agent`` under ``config.rollout``'s settings (val rollouts at
    ``val_temperature``), running on a daemon thread already started."""
    settings = config.rollout
    runner = Runner(
        agent,
        store,
        gateway_url=gateway_url,
        api_key=api_key,
        rollout_keys=rollout_keys,
        model=settings.model,
        resources=settings.resources,
        concurrency=settings.concurrency,
        heartbeat_s=settings.heartbeat_s,
        writer=writer,
        mode_resources={"val": {"temperature": config.val_temperature}},
    )
    thread = threading.Thread(target=runner.run_sync, name="agl-runner", daemon=True)
    thread.start()
    return runner, thread
