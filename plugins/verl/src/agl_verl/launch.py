"""``agl train --backend verl`` with ``mode: distributed``: verl's trainer on Ray, fed by agl.

What :func:`train_distributed` runs, in order:

1. **Config.** The trainer config is checked against what this mode can honour (no engine of
   agl's own, one trained policy, no recorded rollouts, ...; each refused with the field and
   the reason) and mapped onto the verl settings (``steps``, ``batch_size``, ``n_rollouts``,
   ``val_every``, ``transitions``, ``plugins``). verl's own ``validate_config`` checks the
   composed trainer config.
2. **Data.** The tasks go into the store and into the parquet files verl's dataset reads
   (``<workdir>/data/train.parquet``, ``val.parquet``). A store the Ray workers cannot open
   themselves (SQLite) is served over HTTP from this process, with a token.
3. **Services.** agl's gateway starts with no upstream (the agent loops register verl's
   vLLM servers through ``POST /admin/upstreams``), and an in-process runner runs the agent
   (or ``rollout.runners: external`` leaves that to ``agl runner`` processes). Rollouts an
   earlier attempt of this run left queued or running are taken back (cancelled).
4. **Workers.** Ray starts (a local cluster, or the one ``distributed.ray_address`` names)
   with the credentials in its runtime environment, and every node runs the agent loop's
   worker setup once: the plugins load, the store answers, the gateway token is there. A
   worker that cannot fails the run here.
5. **Trainer.** verl's V1 trainer with agl's advantage step (:class:`AglTaskRunner`). It
   needs CUDA GPUs; without them the run stops here with :class:`NeedsGPUs`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agl.credentials import RolloutKeys, new_token
from agl.env import GATEWAY_ADMIN_TOKEN, STORE_TOKEN
from agl.errors import ConfigError
from agl.schema import Task
from agl_verl.config import VerlSettings, parse_settings

log = logging.getLogger(__name__)

RUN_FILE = "agl_distributed.json"
"""The run's id in its workdir: a resumed run names its rollouts as the first attempt did."""


def distributed_settings(config: Any) -> VerlSettings | None:
    """The verl settings of a trainer config whose backend is verl in distributed mode, else None."""
    backend = config.backend
    if backend is None or backend.name != "verl" or backend.config.get("mode") != "distributed":
        return None
    return parse_settings(backend.config)


def _refuse(config: Any, settings: VerlSettings) -> None:
    """Raise :class:`ConfigError` for what distributed mode cannot honour."""
    problems = {
        "engine": config.engine is not None and "verl's vLLM rollout servers serve the policy",
        "engine_urls": bool(config.engine_urls) and "verl's vLLM rollout servers serve the policy",
        "policies": bool(config.policies) and "verl's trainer trains one policy",
        "from_store": config.from_store is not None and "verl's trainer generates its own rollouts",
        "gateway.url": config.gateway.url is not None and "agl train starts the gateway verl's servers register with",
        "loggers": bool(config.loggers)
        and "verl logs itself: set trainer.logger in backend.config.distributed."
        "overrides (e.g. 'trainer.logger=[console,tensorboard]')",
        "val_max_tasks": config.val_max_tasks is not None and "verl validates on every row of the val file",
        "transitions.credit": config.transitions.credit != "broadcast"
        and "verl gives every call of a rollout the rollout's advantage: set it to broadcast",
        "transitions.normalize": config.transitions.normalize != "none"
        and "verl weighs every call of a rollout alike: set it to none",
    }
    for field, reason in problems.items():
        if reason:
            raise ConfigError(f"{field}: not in distributed mode ({reason})")
    told = config.rollout.resources.get("temperature")
    if told is not None and float(told) != settings.temperature:
        raise ConfigError(
            f"rollout.resources.temperature: {told:g} is not backend.config.temperature {settings.temperature:g}"
        )


def _merged(config: Any, settings: VerlSettings) -> VerlSettings:
    """``settings`` with the trainer config's steps, batch and validation where the backend's leave them open."""
    d = settings.distributed
    given = d.model_fields_set
    pairs = {
        "total_training_steps": ("steps", config.steps),
        "train_batch_size": ("batch_size", config.batch_size),
        "rollout_n": ("n_rollouts", config.n_rollouts),
        "test_freq": ("val_every", config.val_every or None),
        "val_before_train": ("val_before", config.val_before),
    }
    update = {}
    for name, (field, value) in pairs.items():
        if name in given and getattr(d, name) != value and field in config.model_fields_set:
            raise ConfigError(f"{field}: {value} differs from backend.config.distributed.{name} {getattr(d, name)}")
        if name not in given:
            update[name] = value
    workdir = settings.workdir if "workdir" in settings.model_fields_set else str(Path(config.workdir) / "verl")
    data = settings.model_dump()
    data["distributed"] = {**d.model_dump(), **update}
    data["workdir"] = workdir
    return parse_settings(data)


def _run_id(workdir: Path) -> str:
    """The run's id, kept in the workdir so that a resumed run (verl's resume_mode auto) keeps it."""
    path = workdir / RUN_FILE
    if path.exists():
        return json.loads(path.read_text())["run_id"]
    run_id = uuid.uuid4().hex[:12]
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": run_id}))
    return run_id


class DistributedRun:
    """One distributed-mode run's services (store server, gateway, runner) and its verl config."""

    def __init__(self, config: Any, settings: VerlSettings):
        _refuse(config, settings)
        self.config = config
        self.settings = _merged(config, settings)
        self.workdir = Path(self.settings.workdir).resolve()
        self.run_id = _run_id(self.workdir)
        self.env: dict[str, str] = {}
        """Credentials the Ray workers get in their runtime environment."""
        self.store: Any = None
        self.store_url: str | None = None
        self._store_server: Any = None
        self.gateway: Any = None
        self._writer: Any = None
        self.runner: Any = None
        self._runner_thread: threading.Thread | None = None
        self.entry: dict[str, Any] = {}
        self.trainer_config: Any = None
        self.taken_back: list[str] = []
        self._own_ray = False

    # -- 2. data -------------------------------------------------------------------------------
    def prepare_data(self, train: Sequence[Task], val: Sequence[Task]) -> tuple[Path, Path | None]:
        """Open the store (served over HTTP when the workers could not open it), add the tasks, write the parquets."""
        from agl.store import open_store
        from agl_verl.distributed import write_tasks_parquet

        if not train:
            raise ConfigError("train_tasks: no tasks given")
        url = self.settings.distributed.store_url or self.config.store_url()
        self.store = open_store(url)
        self.store.add_tasks([*train, *val])
        if "://" in url and not url.startswith("sqlite://"):
            self.store_url = url
            if url.startswith("http") and STORE_TOKEN.get():
                self.env[str(STORE_TOKEN)] = STORE_TOKEN.get() or ""
        else:
            self.store_url = self._serve_store()
        data = self.workdir / "data"
        train_file = write_tasks_parquet(train, data / "train.parquet")
        val_file = write_tasks_parquet(val, data / "val.parquet", mode="val") if val else None
        return train_file, val_file

    def _serve_store(self) -> str:
        from agl_trainer.store_server.server import ServerThread

        token = STORE_TOKEN.get() or new_token(24)
        self._store_server = ServerThread(self.store, token=token, host=self.settings.distributed.host).start()
        self.env[str(STORE_TOKEN)] = token
        return self._store_server.url

    # -- 3. services ---------------------------------------------------------------------------
    def start_services(self, agent: Any) -> None:
        """Take back the last attempt's rollouts, start the gateway (no upstream yet) and the runner."""
        from agl.capture.writer import BufferedWriter
        from agl_trainer.gateway import Gateway
        from agl_verl.rollout_bridge import take_back_rollouts
        from agl_verl.worker_context import ROLLOUT_ID_PREFIX

        self.taken_back = take_back_rollouts(self.store, f"{ROLLOUT_ID_PREFIX}{self.run_id}-")
        if self.taken_back:
            log.warning("agl: took back %d rollouts an earlier attempt left unfinished", len(self.taken_back))
        admin_token = GATEWAY_ADMIN_TOKEN.get() or new_token(24)
        self._writer = BufferedWriter(self.store)
        self.gateway = Gateway(
            self.store,
            [],
            token=self.config.gateway.token,
            admin_token=admin_token,
            keys=RolloutKeys.from_env(),
            host=self.settings.distributed.host,
            port=self.config.gateway.port,
            writer=self._writer,
        ).start()
        self.env[str(GATEWAY_ADMIN_TOKEN)] = admin_token
        if self.config.rollout.runners == "inprocess":
            self._start_runner(agent)

    def _start_runner(self, agent: Any) -> None:
        from agl_trainer.inprocess_runner import start_inprocess_runner

        if agent is None:
            raise ConfigError("agent: needed for in-process runners (or set rollout.runners: external)")
        cfg = self.config
        self.runner, self._runner_thread = start_inprocess_runner(
            cfg,
            agent,
            self.store,
            gateway_url=self.gateway.url,
            api_key=self.gateway.token,
            rollout_keys=self.gateway.keys,
            writer=self._writer,
        )

    # -- verl's config ---------------------------------------------------------------------------
    def compose(self, train_file: Path, val_file: Path | None) -> Any:
        """The agent-loop entry and verl's trainer config, checked by verl's ``validate_config``."""
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        from agl_verl.distributed import compose_trainer_config, write_agent_loop_config

        loops = write_agent_loop_config(
            self.workdir / "agent_loops.yaml",
            store_url=self.store_url,
            rollout_timeout_s=self.settings.distributed.rollout_timeout_s,
            transition_config=self.config.transitions.model_dump(mode="json"),
            plugins=self.config.plugins,
            gateway_url=self.gateway.url if self.gateway is not None else None,
            run_id=self.run_id,
        )
        from omegaconf import OmegaConf

        self.entry = OmegaConf.to_container(OmegaConf.load(loops))[0]
        cfg = compose_trainer_config(
            self.settings,
            train_files=str(train_file),
            agent_loop_config=str(loops),
            val_files=str(val_file) if val_file else None,
        )
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        self.trainer_config = cfg
        return cfg

    # -- 4. workers ------------------------------------------------------------------------------
    def start_workers(self) -> list[dict[str, Any]]:
        """Start (or join) Ray with the workers' environment; set up the agent loop's context on every node."""
        import ray

        if not ray.is_initialized():
            ray.init(**ray_init_options(self.trainer_config, self.env, self.settings.distributed.ray_address))
            self._own_ray = True
        return preflight(self.entry)

    # -- 5. trainer ------------------------------------------------------------------------------
    def train(self) -> None:
        """verl's V1 trainer with agl's advantage step (needs CUDA GPUs)."""
        from agl_verl.distributed import require_gpus

        require_gpus()
        from verl.trainer.main_ppo import run_ppo

        from agl_verl.task_runner import AglTaskRunner

        run_ppo(self.trainer_config, task_runner_class=AglTaskRunner)

    def close(self) -> None:
        """Stop Ray (if this run started it), the runner, the gateway and the store server; close the store."""
        if self._own_ray:
            import ray

            ray.shutdown()
        if self.runner is not None:
            self.runner.stop()
            if self._runner_thread is not None:
                self._runner_thread.join(30)
            self.runner.close()
        if self.gateway is not None:
            self.gateway.stop()
        if self._writer is not None:
            self._writer.close()
        if self._store_server is not None:
            self._store_server.stop()
        if self.store is not None:
            self.store.close()


def ray_init_options(trainer_config: Any, env: dict[str, str], address: str | None) -> dict[str, Any]:
    """``ray.init`` options: verl's own runtime environment (what ``run_ppo`` would start Ray with)
    plus the credentials and ``PYTHONPATH`` the agent-loop workers need."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    runtime_env = OmegaConf.to_container(OmegaConf.create(get_ppo_ray_runtime_env(trainer_config)))
    env_vars = runtime_env.setdefault("env_vars", {})
    env_vars["TRANSFER_QUEUE_ENABLE"] = "1"
    env_vars.update(env)
    if os.environ.get("PYTHONPATH"):
        env_vars.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    options: dict[str, Any] = {"runtime_env": runtime_env}
    if address is not None:
        options["address"] = address
    else:
        options["include_dashboard"] = False
    return options


def preflight(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Set up the agent loop's worker context once on every Ray node (see
    :func:`agl_verl.worker_context.check_worker`); the first failure is raised here."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from agl_verl.worker_context import check_worker

    remote = ray.remote(num_cpus=0)(check_worker)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    refs = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(entry)
        for node in nodes
    ]
    return ray.get(refs)


def train_distributed(config: Any, agent: Any, train: Sequence[Task], val: Sequence[Task]) -> int:
    """Run distributed mode from a trainer config (what ``agl train`` calls); see the module docstring."""
    from agl.plugins import load_plugin

    settings = distributed_settings(config)
    if settings is None:
        raise ConfigError("backend: distributed mode needs backend.name verl and backend.config.mode distributed")
    for i, spec in enumerate(config.plugins):
        load_plugin(spec, f"plugins[{i}]")
    run = DistributedRun(config, settings)
    try:
        train_file, val_file = run.prepare_data(train, val)
        print(f"agl train: distributed mode, run {run.run_id}; data in {train_file.parent}", flush=True)
        run.start_services(agent)
        print(f"agl train: gateway {run.gateway.url} (verl's rollout servers are registered as they start)", flush=True)
        run.compose(train_file, val_file)
        checked = run.start_workers()
        print(f"agl train: {len(checked)} Ray node(s) ready: {checked}", flush=True)
        run.train()
    finally:
        run.close()
    return 0
