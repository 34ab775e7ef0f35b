"""What each verl agent-loop worker process holds once, for every :class:`AglAgentLoop` it builds.

verl builds an agent loop per sample (hydra-instantiated from the agent-loop config), so
anything an agent loop opened itself would be opened thousands of times a step. A
:class:`WorkerContext` is made once per process and per :class:`WorkerSetup`: the reward
plugins loaded (a spec that cannot load raises :class:`WorkerSetupError`, never a silently
unrewarded rollout), one store client, the rollout bridge with the run's transition config,
and the link that registers verl's rollout servers with agl's gateway. It is closed when
the process exits (``atexit``) or by :func:`close_worker_contexts`.

Credentials never travel in the config: the store client reads ``$AGL_STORE_TOKEN`` and the
gateway link ``$AGL_GATEWAY_ADMIN_TOKEN``, which ``agl train`` puts in Ray's runtime
environment for every worker.
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from agl.env import STORE_URL
from agl.errors import AglError

ROLLOUT_ID_PREFIX = "verl-"
"""Rollouts the agent loop enqueues are named ``verl-<run id>-<random>``."""


class WorkerSetupError(AglError, RuntimeError):
    """A verl worker cannot be set up for agl's agent loop (a plugin, the store, the gateway)."""


def _plain(value: Any) -> Any:
    """A hydra/OmegaConf value as plain Python (lists and dicts)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    return value


@dataclass(frozen=True)
class WorkerSetup:
    """The agent-loop entry's settings (see :func:`agl_verl.distributed.write_agent_loop_config`)."""

    store_url: str | None = None
    rollout_timeout_s: float = 600.0
    transition_config: Mapping[str, Any] = field(default_factory=dict)
    plugins: Sequence[str] = ()
    gateway_url: str | None = None
    run_id: str = "run"
    max_rollouts: int = 512
    """Rollouts one worker process waits for at once (each holds a thread while it waits)."""

    @classmethod
    def of(cls, **entry: Any) -> WorkerSetup:
        """From the entry's values as hydra passes them (OmegaConf containers included)."""
        values = {k: _plain(v) for k, v in entry.items() if v is not None}
        values["plugins"] = tuple(values.get("plugins") or ())
        values["transition_config"] = dict(values.get("transition_config") or {})
        return cls(**values)

    @property
    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=list)

    @property
    def rollout_prefix(self) -> str:
        return f"{ROLLOUT_ID_PREFIX}{self.run_id}-"


def load_plugins(specs: Sequence[str]) -> list[str]:
    """Register each plugin ``spec`` in this process; a spec that cannot load raises :class:`WorkerSetupError`."""
    from agl.plugins import load_plugin

    loaded = []
    for i, spec in enumerate(specs):
        try:
            loaded.append(load_plugin(spec, f"plugins[{i}]"))
        except Exception as exc:
            raise WorkerSetupError(f"plugins[{i}] {spec!r} cannot be loaded in this verl worker: {exc}") from exc
    return loaded


class WorkerContext:
    """The process's plugins, store client, rollout bridge and gateway link for one :class:`WorkerSetup`."""

    def __init__(self, setup: WorkerSetup):
        from agl.store import open_store
        from agl_verl.gateway_link import GatewayLink
        from agl_verl.rollout_bridge import RolloutBridge

        self.setup = setup
        self.plugins = load_plugins(setup.plugins)
        url = setup.store_url or STORE_URL.get()
        if not url:
            raise WorkerSetupError(f"AglAgentLoop: no store_url in the agent-loop config and {STORE_URL} is unset")
        try:
            self.store = open_store(url)
        except Exception as exc:
            raise WorkerSetupError(f"AglAgentLoop: cannot open the store {url}: {exc}") from exc
        self.bridge = RolloutBridge(
            self.store,
            timeout_s=setup.rollout_timeout_s,
            transition_config=dict(setup.transition_config),
            rollout_prefix=setup.rollout_prefix,
            executor=ThreadPoolExecutor(max_workers=setup.max_rollouts, thread_name_prefix="agl-rollout"),
        )
        self.gateway = GatewayLink(setup.gateway_url) if setup.gateway_url else None

    def close(self) -> None:
        if self.bridge.executor is not None:
            self.bridge.executor.shutdown(wait=False, cancel_futures=True)
        self.store.close()


_contexts: dict[str, WorkerContext] = {}
_lock = threading.Lock()


def worker_context(setup: WorkerSetup) -> WorkerContext:
    """This process's context for ``setup``, made on first use."""
    with _lock:
        context = _contexts.get(setup.key)
        if context is None:
            context = _contexts[setup.key] = WorkerContext(setup)
        return context


def close_worker_contexts() -> None:
    """Close every context of this process (their store clients and threads)."""
    with _lock:
        contexts = list(_contexts.values())
        _contexts.clear()
    for context in contexts:
        context.close()


def check_worker(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Set up a context from an agent-loop ``entry`` in this process and say what it holds.

    Run inside a Ray worker at startup (:func:`agl_verl.launch.preflight`), so that a plugin
    that cannot load, a store that cannot be opened or a missing credential stops the run
    before verl starts, instead of failing every rollout.
    """
    fields = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
    context = worker_context(WorkerSetup.of(**fields))
    from agl.plugins import get_plugin_manager

    rewards = [impl.plugin_name for impl in get_plugin_manager().hook.agl_reward.get_hookimpls()]
    try:
        context.store.stats()  # a round trip: the URL and the token work from this worker
    except Exception as exc:
        raise WorkerSetupError(f"AglAgentLoop: the store {context.store!r} does not answer this worker: {exc}") from exc
    return {"plugins": context.plugins, "reward_plugins": rewards, "gateway": bool(context.gateway)}


atexit.register(close_worker_contexts)
