"""The training loop: rollouts → transitions → backend update → new model version.

.. code-block:: python

    trainer = agl.Trainer({"steps": 20, "backend": {"name": "verl", "config": {...}}})
    trainer.fit(agent, train_tasks, val_tasks)

Each step ``s`` (1-based):

1. enqueue ``n_rollouts`` rollouts for each task of the step's batch (ids derived
   from the run, the step and the task, so enqueueing again after a crash is a
   no-op), recording the step and the model version;
2. run them (an in-process :class:`~agl.runner.Runner` by default, or external
   ``agl runner`` processes) and wait until every one has ended, taking back the
   rollouts of silent runners with :meth:`Store.expire`;
3. build transitions (:mod:`agl_trainer.transitions`), keep those with engine token ids
   (all of them, with their text, for a backend that learns from text such as agl-apo's),
   and call ``agl_rollout_ended`` / ``agl_transitions_built``;
4. ``backend.train_step``; then publish: pause the gateway, ``backend.publish``,
   register the version in the store, point the gateway at it, resume;
5. evaluate on the val split every ``val_every`` steps (mode ``val`` rollouts,
   not trained on; ``resources["temperature"] = val_temperature``);
6. checkpoint: ``backend.save_checkpoint`` into ``workdir/checkpoints/step-s``,
   the step's metrics into ``metrics.jsonl`` (and ``agl_step_ended``), then
   ``trainer_state.json`` atomically. That last write is what makes the step done.

Asynchronous steps (``rollout.max_staleness: k``): step 1 also queues the rollouts of
steps 2..k+1, and each later step queues the one k ahead, behind its own, so the runners
keep generating while the step trains; a transition more than k versions behind the
learner is dropped and counted. Recorded traffic (``from_store``): step 1 generates
nothing, it takes the oldest ended rollouts the filter chooses that the run has not
trained on (:mod:`agl_trainer.recorded`), and the state file records them with the step.
Dynamic sampling (``filter_groups.enable``, verl's DAPO): a step may run several generation
batches of new tasks until ``batch_size`` groups with a reward signal are kept, and trains on those
(:mod:`agl_trainer.group_filter`); the next task position is kept in the state file with the step.
Either way the backend learns which version its weights are (``BackendContext.current_version``)
and corrects for transitions of another.

Resume: starting again on the same workdir continues after the last completed
step. The backend reloads that step's checkpoint; the interrupted step's rollouts
are enqueued again under the same ids (a no-op for those that exist), those
that ended are kept as they are, and those left running by the dead process go
back to the queue through the retry policy (the interrupted attempt counts
against ``max_attempts``). So no rollout is lost, none is run again once ended,
and no step's data is trained on twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl.capture import BufferedWriter
from agl.credentials import RolloutKeys
from agl.env import ROLLOUT_KEY_SECRET, warn_unknown
from agl.errors import ConfigError, InvalidTransition
from agl.runner import Agent, Runner
from agl.schema import ModelVersion, Rollout, RolloutStatus, Task, Transition, short_id
from agl.store.base import Store, open_store
from agl_trainer.backend import Backend, BackendContext
from agl_trainer.baselines import with_baselines
from agl_trainer.capture_check import capture_switched_on, silent_capture_warning
from agl_trainer.config import TrainerConfig, parse_config
from agl_trainer.engine import Engine
from agl_trainer.group_filter import Group, GroupFilter, TooFewGroups
from agl_trainer.inprocess_runner import start_inprocess_runner
from agl_trainer.loggers import Logger, RunInfo, build_loggers, redacted
from agl_trainer.metrics import (
    MetricsLog,
    before_after,
    before_after_markdown,
    console_line,
    plot_reward_curve,
    print_before_after,
    reward_metrics,
    transition_metrics,
)
from agl_trainer.policy_backends import Policy, PolicySet
from agl_trainer.recorded import RecordedRollouts
from agl_trainer.rollout_ids import generation, rollout_prefix
from agl_trainer.transitions import BuildReport, TransitionBuilder

log = logging.getLogger(__name__)

JOIN_COUNTS = ("joined_by_id", "joined_by_order", "gateway_only", "text_only")
"""The build report's join counts: in every step record (``build_*``), zeros too."""

STATE_FILE = "trainer_state.json"
# Fields a resumed run may change: more steps extend it; output switches change nothing trained.
_FREE_ON_RESUME = {"steps", "progress", "plot", "loggers"}


@contextlib.contextmanager
def _timed(record: dict[str, Any], key: str) -> Iterator[None]:
    """Add the seconds the block took to ``record[key]`` (set when absent: a phase timed in parts, as a
    filtered step's generation batches are, adds up)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        record[key] = record.get(key, 0.0) + time.perf_counter() - started


def rollout_seed(*parts: object) -> int:
    """A rollout's sampling seed from what identifies it (run seed, split, step, task, index), never
    from when it was scheduled: the same config samples the same way on every run."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _changed_keys(stored: dict[str, Any] | None, current: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: old → new`` for each leaf that differs (nothing for a state saved before configs were kept)."""
    if stored is None:
        return []
    out = []
    for key in sorted(set(stored) | set(current)):
        old, new = stored.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += _changed_keys(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key}: {old!r} → {new!r}")
    return out


def final_versions(model_version: str | None, policy_versions: dict[str, str | None]) -> str:
    """``model version step-30``; in a run of named policies, each one's: ``model versions writer
    writer-step-30, checker base``."""
    if not policy_versions:
        return f"model version {model_version}"
    return "model versions " + ", ".join(f"{name} {version or 'base'}" for name, version in policy_versions.items())


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns."""

    steps_completed: int
    """How many training steps the run completed (with a resumed run's earlier ones)."""
    model_version: str | None
    """The model version the run ended on."""
    policy_versions: dict[str, str | None] = field(default_factory=dict)
    """In a run of named policies, the version each ended on (the base model's is ``base``); else empty."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The run's metric records, one per step and evaluation, as in ``<workdir>/metrics.jsonl``."""
    before: dict[str, float] | None = None
    """The held-out metrics (``val_*``) before the first step; None without a val split or with ``val_before`` off."""
    after: dict[str, float] | None = None
    """The held-out metrics after the last step; None without a val split."""
    reward_curve: Path | None = None
    """The reward curve's PNG (``<workdir>/reward_curve.png``); None when not drawn."""

    def summary(self) -> str:
        """A few lines: steps, final version, and the held-out reward before and after."""
        lines = [f"{self.steps_completed} steps; {final_versions(self.model_version, self.policy_versions)}"]
        for label, key in [("held-out reward", "val_reward_mean"), ("held-out success", "val_success_rate")]:
            b = None if self.before is None else self.before.get(key)
            a = None if self.after is None else self.after.get(key)
            if b is not None or a is not None:
                fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
                lines.append(f"{label}: {fmt(b)} -> {fmt(a)}")
        if self.reward_curve is not None:
            lines.append(f"reward curve: {self.reward_curve}")
        return "\n".join(lines)


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    """The positions ``0..count-1`` in the order a run of ``seed`` takes its train tasks in ``epoch``."""
    order = list(range(count))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def as_tasks(items: Iterable[Task | dict[str, Any] | Any], split: str) -> list[Task]:
    """Tasks from Task objects, ``{"task_id"?, "input", ...}`` dicts, or bare inputs.

    A task given without an id gets one derived from its position and content, so
    the same dataset gets the same ids on every run (what resume relies on).
    """
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Task):
            out.append(item if item.split == split else item.model_copy(update={"split": split}))
            continue
        if isinstance(item, dict) and "input" in item and set(item) <= {"task_id", "input", "metadata", "split"}:
            data = dict(item)
        else:
            data = {"input": item}
        if not data.get("task_id"):
            digest = hashlib.sha1(json.dumps(data["input"], sort_keys=True, default=str).encode()).hexdigest()[:10]
            data["task_id"] = f"{split}-{i}-{digest}"
        data["split"] = split
        try:
            out.append(Task.model_validate(data))
        except Exception as exc:
            raise ConfigError(f"{split} tasks: item {i}: {exc}") from None
    return out


def load_tasks_jsonl(path: str | Path, split: str) -> list[Task]:
    """Tasks from a JSONL file: one JSON object a line (an ``input`` key, or the whole object as input)."""
    tasks = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except ValueError as exc:
            raise ConfigError(f"{path}: line {n} is not JSON: {exc}") from None
    return as_tasks(tasks, split)


class Trainer:
    """Trains an agent with a backend; see the module docstring for the loop.

    ``config`` is a :class:`~agl_trainer.config.TrainerConfig` or a dict of one. A
    ``backend``, ``engine`` or ``store`` object given here is used instead of the
    one the config names (the trainer then does not close the store).
    """

    def __init__(
        self,
        config: TrainerConfig | dict[str, Any] | None = None,
        *,
        backend: Backend | None = None,
        engine: Engine | None = None,
        store: Store | None = None,
    ):
        self.config = config if isinstance(config, TrainerConfig) else parse_config(config or {})
        """The validated configuration."""
        self.workdir = Path(self.config.workdir)
        """Where checkpoints, metrics and plots go (``config.workdir``)."""
        self._backend = backend
        self.policies = PolicySet(self.config.policies)
        """The run's policies, each trained one with its backend."""
        self._engine = engine
        self._store = store
        self._own_store = store is None
        self.gateway: Any = None
        """The in-process gateway while ``fit`` runs one; None otherwise."""
        self.runner: Runner | None = None
        """The in-process runner while ``fit`` runs one; None otherwise (external runners, or not started)."""
        self._runner_thread: threading.Thread | None = None
        self._version_steps: dict[str | None, int] = {}
        self._writer: BufferedWriter | None = None
        self._recorded: RecordedRollouts | None = None
        """Where ``from_store`` runs take their rollouts (None: the trainer generates them)."""
        self._capture_warned = False
        """Whether this run said already that capture was on and recorded nothing (said once a run)."""
        self._score_tasks: list[Task] = []
        """What a backend that scores resources may run (``BackendContext.score_tasks``): the val split, else train."""
        self.console: Any = None
        """The console progress and results are printed to (stderr), from when ``fit`` starts."""
        self.loggers: list[Logger] = []
        """The experiment-tracker loggers of the config's ``loggers``, registered as plugins while ``fit`` runs."""

    # -- entry point ---------------------------------------------------------------------
    def fit(
        self, agent: Agent | None, train_tasks: Iterable[Any], val_tasks: Iterable[Any] | None = None
    ) -> TrainResult:
        """Train; returns the final version, the metrics history and the before/after evaluation.

        ``agent`` may be None when rollouts run in external ``agl runner`` processes.
        """
        train, val = self._prepare(agent, train_tasks, val_tasks)
        state = self._load_state()
        metrics = MetricsLog(self.workdir / "metrics.jsonl", store=self._store, run_id=state.get("run_id"))
        # How this run turns rollouts into transitions, for the dashboard's rollout pages.
        transitions = self.config.transitions.model_dump(mode="json")
        metrics.keep_in_store({"kind": "config", "step": 0, "transitions": transitions})
        metrics.truncate_after(state["completed_step"])
        try:
            self._start_loggers(state)
            self._score_tasks = val or train
            self._recover(state)
            self._start(agent, state)
            self._save_state(state)
            self._evaluate_once(val, "before", state, metrics)
            self._run_steps(train, val, state, metrics)
            self._evaluate_once(val, "after", state, metrics)
            return self._report(state, metrics)
        except BaseException:
            self._stop_loggers(failed=True)  # W&B marks the run failed
            raise
        finally:
            self._stop()

    def _prepare(
        self, agent: Agent | None, train_tasks: Iterable[Any], val_tasks: Iterable[Any] | None
    ) -> tuple[list[Task], list[Task]]:
        """Check the inputs, load the config's plugins and loggers, open the store and add the tasks to it."""
        cfg = self.config
        warn_unknown()
        if agent is None and cfg.rollout.runners == "inprocess" and cfg.from_store is None:
            raise ConfigError("agent: needed for in-process runners (or set rollout.runners: external)")
        from rich.console import Console

        from agl.plugins import get_plugin_manager, load_plugin

        for i, spec in enumerate(cfg.plugins):
            load_plugin(spec, f"plugins[{i}]")
        self.loggers = build_loggers(cfg.loggers)  # an unknown logger or a missing library stops us here
        self.console = Console(stderr=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        train = as_tasks(train_tasks, "train")
        val = as_tasks(val_tasks or [], "val")
        if not train and cfg.from_store is None:
            raise ConfigError("train_tasks: no tasks given")
        if agent is None and val:
            raise ConfigError("val_tasks: evaluating needs the agent (or give no val tasks)")
        if cfg.val_max_tasks is not None:
            val = val[: cfg.val_max_tasks]
        store = self._store = self._store or open_store(cfg.store_url())
        store.add_tasks(train + val)
        answers = bool(get_plugin_manager().hook.agl_reward.get_hookimpls()) and cfg.transitions.reward_plugins
        if answers and cfg.transitions.credit == "emitted" and cfg.transitions.agent_rewards == "without_plugin":
            log.warning(
                "transitions.credit: 'emitted' spreads the rewards the agent emits, but a reward plugin grades the "
                "rollouts and transitions.agent_rewards 'without_plugin' leaves the agent's rewards out of those: "
                "the credit is the final reward alone; set transitions.agent_rewards: always to count them"
            )
        if cfg.from_store is not None:
            self._recorded = RecordedRollouts(store, cfg.from_store, rewards_from_plugins=answers)
        return train, val

    def _run_steps(self, train: list[Task], val: list[Task], state: dict[str, Any], metrics: MetricsLog) -> None:
        """The steps after the last completed one, each made durable as it ends."""
        cfg = self.config
        for step in range(state["completed_step"] + 1, cfg.steps + 1):
            record = self._step(step, train, val, state)
            if record is None:
                self.console.print(f"agl: no recorded rollouts left to train on; stopping before step {step}")
                return
            self._complete(step, record, state, metrics)

    def _complete(self, step: int, record: dict[str, Any], state: dict[str, Any], metrics: MetricsLog) -> None:
        """Checkpoint the step, record its metrics, then write the state file: that write makes it done."""
        ckpt = self.workdir / "checkpoints" / f"step-{step}"
        self.policies.save_checkpoints(ckpt)
        metrics.append(record)
        self._hook("agl_step_ended", step=step, metrics=record)
        state["completed_step"] = step
        state["checkpoint"] = str(ckpt)
        self._save_state(state)
        self._prune_checkpoints(keep=ckpt)
        width = self.console.width if self.console.is_terminal else None  # a log file: one line a step
        self.console.print(console_line(record, self.config.steps, width), soft_wrap=True, highlight=False)

    def _evaluate_once(self, val: list[Task], when: str, state: dict[str, Any], metrics: MetricsLog) -> None:
        """The evaluation ``before`` the first step (if ``val_before``) or ``after`` the last, once a run.

        The rollouts ``after`` are ``<run>-val<steps + 1>-<i>``; its metrics go at the last training step.
        """
        cfg = self.config
        if not val or state.get(when) is not None or (when == "before" and not cfg.val_before):
            return
        tag_step, metric_step = (0, 0) if when == "before" else (cfg.steps + 1, cfg.steps)
        state[when] = self.evaluate(val, tag_step, state, label=when)
        self._save_state(state)
        metrics.append({"kind": "val", "step": metric_step, **state[when]})
        self._log_evaluation(metric_step, state[when])

    # -- state ---------------------------------------------------------------------------
    def _load_state(self) -> dict[str, Any]:
        path = self.workdir / STATE_FILE
        config = self._resumable_config()
        if path.exists():
            state = json.loads(path.read_text())
            changed = _changed_keys(state.get("config"), config)
            if changed:
                raise ConfigError(
                    f"workdir {self.workdir}: it holds run {state['run_id']} (done to step {state['completed_step']}) "
                    f"with another config ({'; '.join(changed)}); resume it with the same config, "
                    "or start over in a new or emptied workdir"
                )
            self.console.print(
                f"agl: resuming run {state['run_id']} after step {state['completed_step']} in {self.workdir}",
                soft_wrap=True,
            )
            state["config"] = config
            state["resumes"] = state.get("resumes", 0) + 1
            self._save_state(state)  # before any rollout is made under the new ids (see agl_trainer.rollout_ids)
            return state
        return {
            "config": config,
            "run_id": "run-" + short_id(12),
            "resumes": 0,
            "completed_step": 0,
            "model_version": None,
            "checkpoint": None,
            "before": None,
            "after": None,
        }

    def _resumable_config(self) -> dict[str, Any]:
        """The config a run is resumed under: all of it but what may change between resumes."""
        exclude: dict[str, Any] = dict.fromkeys(_FREE_ON_RESUME, True)
        # off: the state of a run from before the setting existed; on: a step that generated too many
        # batches may be resumed with a higher limit, as verl's error suggests
        exclude["filter_groups"] = {"max_gen_batches": True} if self.config.filter_groups.enable else True
        return self.config.model_dump(mode="json", exclude=exclude)

    def _save_state(self, state: dict[str, Any]) -> None:
        path = self.workdir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _prune_checkpoints(self, keep: Path) -> None:
        root = self.workdir / "checkpoints"
        for child in root.iterdir() if root.exists() else []:
            if child != keep and child.name.startswith("step-"):
                shutil.rmtree(child, ignore_errors=True)

    # -- components ----------------------------------------------------------------------
    @property
    def backend(self) -> Backend | None:
        """The backend (the first trained policy's, in a run of several; see :attr:`policies`)."""
        return self._backend

    def _check_temperature(self, backend: Backend) -> None:
        """The agents must be told to sample at the temperature the backend's loss assumes."""
        told = self.config.rollout.resources.get("temperature")
        assumed = backend.sampling_temperature
        if told is None or assumed is None:
            return
        if isinstance(told, bool) or not isinstance(told, (int, float)):
            raise ConfigError(f"rollout.resources.temperature: must be a number, not {told!r}")
        if float(told) == float(assumed):
            return
        raise ConfigError(
            f"rollout.resources.temperature: {told:g} tells the agents to sample at another temperature than "
            f"the backend's {assumed:g}, which its loss divides the logits by; set both to the same value "
            "(for agl-verl, backend.config.temperature)"
        )

    def _backend_context(self, policy: Policy, state: dict[str, Any]) -> BackendContext:
        """What ``policy``'s backend is told at setup: its engine policy, the workdir, the run's resources,
        a way to score candidates, and the policy's version now (read at each use, so each publish shows)."""
        from agl_trainer.scoring import Scorer

        return BackendContext(
            policy=policy.engine_name,
            workdir=self.workdir,
            initial_resources=("r0", dict(self.config.resources)) if self.config.resources else None,
            score=Scorer(self, state),
            score_tasks=tuple(self._score_tasks),
            version_now=lambda: policy.version,
            total_steps=self.config.steps,
        )

    def _resources_now(self) -> dict[str, Any]:
        """The rollout fields naming the resources the next rollouts run with (the backend's, else the run's)."""
        current = self.backend.resources() if self.backend is not None else None
        if current is None and self.config.resources:
            current = ("r0", dict(self.config.resources))
        return {} if current is None else {"resources_version": current[0], "resources": current[1]}

    def _start(self, agent: Agent | None, state: dict[str, Any]) -> None:
        cfg = self.config
        from agl.plugins import resolve

        engine_urls = list(cfg.engine_urls)
        if self._engine is None and cfg.engine is not None:
            self._engine = resolve("engine", cfg.engine.name, cfg.engine.config)
        if self._engine is not None:
            engine_urls = self._engine.start()
        self._start_backends(state)
        version = state["model_version"]
        if version is None:
            version = (self._engine.model_version if self._engine is not None else None) or "base"
            state["model_version"] = version
        self._store.add_model_version(ModelVersion(version=version, step=state["completed_step"]))
        if self._engine is not None and state["completed_step"] > 0:
            try:
                mv = self._store.get_model_version(version)
                if mv.path and self._engine.model_version != version:
                    self._engine.load_version(mv)
            except KeyError:
                pass
        self._remember_version(version, state["completed_step"])
        self._start_policies(state)
        gateway_url, token = cfg.gateway.url, cfg.gateway.token or "agl"
        # One writer for the in-process gateway and runner: the runner flushes it before it marks a
        # rollout finished, so the gateway's records of that rollout are in the store by then too.
        self._writer = BufferedWriter(self._store)
        if gateway_url is None and engine_urls:
            from agl_trainer.gateway import Gateway

            self.gateway = Gateway(
                self._store,
                engine_urls,
                token=cfg.gateway.token,
                keys=RolloutKeys.from_env(),  # external runners make keys with $AGL_ROLLOUT_KEY_SECRET too
                port=cfg.gateway.port,
                model_version=None if self.policies.prefixed else version,
                writer=self._writer,
                engine_logprobs=self._engine.logprobs_kind if self._engine is not None else "raw",
                routes=self.policies.routes(self._engine),
            ).start()
            gateway_url, token = self.gateway.url, self.gateway.token
        # Each agent gets its rollout's key, never the gateway token: made with the in-process
        # gateway's secret, or for a gateway started elsewhere with $AGL_ROLLOUT_KEY_SECRET.
        keys = self.gateway.keys if self.gateway is not None else RolloutKeys.from_env()
        if keys is None and gateway_url and cfg.rollout.runners == "inprocess":
            log.warning(
                "gateway %s: no rollout key secret ($%s): agents get the gateway token, "
                "which the gateway refuses on rollout routes; set the secret the gateway was started with",
                gateway_url,
                ROLLOUT_KEY_SECRET,
            )
        if cfg.rollout.runners == "inprocess" and agent is not None:
            self.runner, self._runner_thread = start_inprocess_runner(
                cfg, agent, self._store, gateway_url=gateway_url, api_key=token, rollout_keys=keys, writer=self._writer
            )

    def _start_backends(self, state: dict[str, Any]) -> None:
        """A backend for each trained policy, set up, and restored from the last checkpoint on resume."""
        from agl.plugins import resolve

        cfg = self.config

        def make(overrides: dict[str, Any]) -> Backend | None:
            return (
                None
                if cfg.backend is None
                else resolve("backend", cfg.backend.name, {**cfg.backend.config, **overrides})
            )

        self.policies.make_backends(self._backend, make)
        self._backend = self.policies.first_backend()
        if self._backend is None:
            log.warning("no backend configured: rollouts run and transitions are built, but nothing is trained")
            return
        for policy, backend in self.policies.backends:
            self._check_temperature(backend)
            backend.setup(self._engine, self._backend_context(policy, state))
        if state["checkpoint"] and state["completed_step"] > 0:
            self.policies.load_checkpoints(Path(state["checkpoint"]))

    def _start_policies(self, state: dict[str, Any]) -> None:
        """Each policy's version, registered in the store, and served by the engine when the engine names it."""
        policies = self.policies
        policies.start_versions(state, self._engine)
        for p in policies.policies:
            if p.engine_name is not None or policies.named:
                self._store.add_model_version(
                    ModelVersion(version=p.version, step=0 if p.version == "base" else None, policy=p.engine_name)
                )
            registered = self._registered_version(p.version)
            self._remember_version(p.version, registered.step or 0 if registered is not None else 0)
        if self._engine is not None:
            policies.serve_resumed(self._engine, self._registered_version)

    def _registered_version(self, version: str) -> ModelVersion | None:
        try:
            return self._store.get_model_version(version)
        except KeyError:
            return None

    def _recover(self, state: dict[str, Any]) -> None:
        """Set a resumed run up to rerun its interrupted step whole.

        The step's rollouts run again under new ids (:mod:`agl_trainer.rollout_ids`), all together
        as in a run never stopped: the same seeds, the same batching, no retry used up, so the
        resumed run trains what an uninterrupted one would have. What the stopped trainer left
        queued or running is cancelled, so no runner spends time on it; what had ended stays in
        the store, untrained.
        """
        if not state.get("resumes"):
            return
        current = rollout_prefix(state)
        left = [
            r
            for status in (RolloutStatus.QUEUED, RolloutStatus.RUNNING)
            for r in self._store.query_rollouts(status=status)
            if generation(r.rollout_id, state["run_id"]) not in (None, state["resumes"])
        ]
        for r in left:
            with contextlib.suppress(InvalidTransition):
                self._store.finish(
                    r.rollout_id,
                    RolloutStatus.CANCELLED,
                    attempt=r.attempt if r.status == RolloutStatus.RUNNING else None,
                    error=f"TrainerRestarted: the trainer was stopped; step {r.step} runs again as {current}-*",
                )
        if left:
            log.info("cancelled %d rollout(s) the stopped trainer left; their step runs again whole", len(left))

    def _start_loggers(self, state: dict[str, Any]) -> None:
        """Open each logger (a failure is its one warning) and register it as a plugin for this run."""
        from agl.plugins import register

        run = RunInfo(
            run_id=state["run_id"],
            workdir=self.workdir,
            config=redacted(self.config.model_dump(mode="json")),
            first_step=state["completed_step"] + 1,
        )
        for logger in self.loggers:
            logger.start(run)
            register(logger, name=f"agl_trainer.loggers.{logger.name}:{id(self)}")

    def _log_evaluation(self, step: int, values: dict[str, float]) -> None:
        """The before/after evaluations, which no ``agl_step_ended`` carries, to the loggers."""
        for logger in self.loggers:
            logger.log_metrics(step, values)

    def _stop_loggers(self, failed: bool = False) -> None:
        from agl.plugins import get_plugin_manager

        pm = get_plugin_manager()
        for logger in self.loggers:
            if pm.is_registered(logger):
                pm.unregister(logger)
            logger.finish(failed=failed)

    def _stop(self) -> None:
        self._stop_loggers()
        if self.runner is not None:
            self.runner.stop()
            if self._runner_thread is not None:
                self._runner_thread.join(30)
            self.runner.close()
            self.runner = None
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for _, backend in self.policies.backends:
            backend.close()
        if self._engine is not None:
            self._engine.stop()
        if self._store is not None and self._own_store:
            self._store.close()
            self._store = None

    def _remember_version(self, version: str | None, step: int) -> None:
        self._version_steps[version] = step

    def _steps_of(self, transitions: list[Transition]) -> dict[str | None, int]:
        """The training step of each model version the transitions ran on (for staleness)."""
        for v in {t.model_version for t in transitions} - set(self._version_steps) - {None}:
            try:
                self._version_steps[v] = self._store.get_model_version(v).step or 0
            except KeyError:
                log.warning("model version %r is not registered in the store; its staleness counts as 0", v)
        return self._version_steps

    # -- one step ------------------------------------------------------------------------
    def _batch(self, step: int, tasks: Sequence[Task]) -> list[Task]:
        """The step's tasks: ``batch_size`` positions of an endless sequence of seeded shuffles of the data
        (or of the data in its order, again and again, without ``shuffle``)."""
        return self._tasks_at((step - 1) * self.config.batch_size, tasks)

    def _tasks_at(self, start: int, tasks: Sequence[Task]) -> list[Task]:
        """The ``batch_size`` tasks at positions ``start, start + 1, ...`` of the endless sequence of :meth:`_batch`."""
        size = self.config.batch_size
        out = []
        for pos in range(start, start + size):
            epoch, index = divmod(pos, len(tasks))
            if not self.config.shuffle:
                out.append(tasks[index])
                continue
            out.append(tasks[epoch_order(len(tasks), self.config.seed, epoch)[index]])
        return out

    def _rollout(self, rollout_id: str, task: Task, step: int, **fields: Any) -> Rollout:
        """A rollout of ``task`` for ``step`` under the config's rollout settings (timeout, length cap, attempts)."""
        settings = self.config.rollout
        return Rollout(
            rollout_id=rollout_id,
            task_id=task.task_id,
            step=step,
            timeout_s=settings.timeout_s,
            max_response_tokens=settings.max_response_tokens,
            max_attempts=settings.max_attempts,
            **fields,
        )

    def _train_rollouts(
        self, step: int, train: list[Task], state: dict[str, Any], gen: int = 0, batch: list[Task] | None = None
    ) -> list[Rollout]:
        """The step's rollouts: ``n_rollouts`` of each task of its batch (task after task), ids and seeds
        derived from the run. ``gen``: the step's generation batch (``filter_groups``), whose ``batch``
        of tasks is given; the first one's ids and seeds are those of a step without filtering."""
        cfg = self.config
        resources = self._resources_now()
        tag, extra = ("", ()) if gen == 0 else (f"-g{gen}", (gen,))
        return [
            self._rollout(
                f"{rollout_prefix(state)}-s{step}{tag}-b{b}-r{k}",
                task,
                step,
                mode="train",
                seed=rollout_seed(cfg.seed, "train", step, task.task_id, k, *extra),
                model_version=state["model_version"],
                **resources,
            )
            for b, task in enumerate(self._batch(step, train) if batch is None else batch)
            for k in range(cfg.n_rollouts)
        ]

    def _filtered_rollouts(
        self, step: int, train: list[Task], state: dict[str, Any], record: dict[str, Any]
    ) -> tuple[list[Rollout], list[Transition], TransitionBuilder]:
        """Generation batches of new tasks until ``batch_size`` groups with a signal are kept
        (:mod:`agl_trainer.group_filter`): every rollout run, the kept groups' transitions, and the builder
        of them all. The next task position goes into ``state`` (saved with the step)."""
        cfg = self.config
        cursor = state.get("task_cursor", (step - 1) * cfg.batch_size)
        picked, builder, ended = GroupFilter(cfg.batch_size), self._builder(), []
        while picked.short:
            limit = cfg.filter_groups.max_gen_batches
            if limit and picked.gen_batches >= limit:
                raise TooFewGroups(
                    f"step {step}: {picked.gen_batches} generation batch(es) kept {len(picked.kept)} group(s) with a "
                    f"reward signal, fewer than batch_size {cfg.batch_size}; filter_groups.max_gen_batches is {limit} "
                    "(the tasks may be too hard or too easy for the model; 0 lets a step generate without limit)"
                )
            gen = picked.gen_batches
            with _timed(record, "time_rollout_s"):
                rollouts = self._train_rollouts(step, train, state, gen, self._tasks_at(cursor, train))
                batch = self.run_rollouts(rollouts, f"step {step}/{cfg.steps}" + (f" (batch {gen + 1})" if gen else ""))
            cursor += cfg.batch_size
            with _timed(record, "time_transitions_s"):
                built = self._build(batch, record, builder)
                n = cfg.n_rollouts
                groups = [
                    Group(gen, rollouts[i].task_id, tuple(r.rollout_id for r in rollouts[i : i + n]))
                    for i in range(0, len(rollouts), n)
                ]
                picked.add(groups, built, builder.finals)
            ended += batch
        state["task_cursor"] = cursor
        record.update(picked.metrics())
        return ended, picked.transitions, builder

    def _step_rollouts(self, step: int, train: list[Task], state: dict[str, Any]) -> list[Rollout] | None:
        """Run (or, from the store, choose) the step's rollouts; None when there is nothing left to train on.

        With ``max_staleness`` k, the next k steps' rollouts are queued behind this step's, so
        the runners go on with them while this step trains (enqueueing is idempotent by id, so
        a resumed run queues nothing twice).
        """
        cfg = self.config
        if self._recorded is not None:
            return self._recorded.next_batch(set(state.get("trained_rollouts", []))) or None
        rollouts = self._train_rollouts(step, train, state)
        self._store.enqueue(rollouts)
        for ahead in range(step + 1, min(step + cfg.rollout.max_staleness, cfg.steps) + 1):
            self._store.enqueue(self._train_rollouts(ahead, train, state))
        return self.run_rollouts(rollouts, f"step {step}/{cfg.steps}")

    def _step(self, step: int, train: list[Task], val: list[Task], state: dict[str, Any]) -> dict[str, Any] | None:
        """One step as its phases: rollouts, build, select, update, publish, evaluate. Its record, or None
        when there was nothing left to train on (recorded traffic)."""
        record: dict[str, Any] = {"kind": "train", "step": step, "model_version": state["model_version"]}
        counted = self._engine_counters()
        started = time.perf_counter()
        built: list[Transition] = []
        builder: TransitionBuilder | None = None  # a filtered step has built its transitions already
        if self.config.filter_groups.enable:
            ended, built, builder = self._filtered_rollouts(step, train, state, record)
        else:
            with _timed(record, "time_rollout_s"):
                ended = self._step_rollouts(step, train, state)
            if ended is None:
                return None
        record.update({f"engine/{k}": v - counted.get(k, 0) for k, v in self._engine_counters().items()})
        if self._recorded is not None:
            record["recorded_rollouts"] = len(ended)
        with _timed(record, "time_transitions_s"):
            if builder is None:
                builder = self._builder()
                built = self._build(ended, record, builder)
            transitions = self._select(built, builder.report, record)
            self._hook("agl_transitions_built", step=step, transitions=transitions)
        record.update(reward_metrics(builder.finals, ended, self.config.success_threshold))
        report = builder.report.as_metrics()
        record.update({f"build_{k}": v for k, v in report.items() if v or k in JOIN_COUNTS})
        self._check_capture(builder.report)
        with _timed(record, "time_update_s"):
            trained, update_metrics = self._update(transitions, step, builder.report.policy_calls)
        record.update(update_metrics)
        sizes = transition_metrics(transitions, self._staleness(transitions), record["time_update_s"])
        if any(k == "tokens_per_s" or k.endswith("/tokens_per_s") for k in update_metrics):
            del sizes["tokens_per_s"]  # the backends' own (each policy's): tokens of the forward passes they ran
        record.update(sizes)
        with _timed(record, "time_publish_s"):
            self._publish_trained(step, trained, ended, state)
        cfg = self.config
        if val and cfg.val_every and step % cfg.val_every == 0 and step != cfg.steps:
            with _timed(record, "time_val_s"):
                record.update(self.evaluate(val, step, state))
        record["time_step_s"] = time.perf_counter() - started
        return record

    def _builder(self) -> TransitionBuilder:
        """A transition builder of the run's settings: with each call's text for a backend that learns from
        text (``Backend.needs_token_ids`` False), and each call's sampling settings (a backend tells calls
        sampled unlike its loss assumes: off-policy)."""
        text_too = self.backend is not None and not self.backend.needs_token_ids
        tcfg = self.config.transitions.model_copy(update={"with_text": text_too, "with_sampling": True})
        return TransitionBuilder(self._store, tcfg)

    def _build(self, ended: list[Rollout], record: dict[str, Any], builder: TransitionBuilder) -> list[Transition]:
        """The build phase: the ended rollouts announced (``agl_rollout_ended``), then their transitions by
        ``builder`` (which keeps the report and final rewards): engine ones, or every one, with its text,
        for a backend that learns from text."""
        for r in ended:
            self._hook("agl_rollout_ended", rollout=r)
        built = list(builder.iter(ended))
        # calls of a hosted model (no engine token ids) never feed a policy-gradient update
        record["text_only_calls"] = record.get("text_only_calls", 0) + sum(t.token_source == "text" for t in built)
        return built if builder.config.with_text else [t for t in built if t.token_source == "engine"]

    def _select(self, transitions: list[Transition], report: BuildReport, record: dict[str, Any]) -> list[Transition]:
        """The select phase: leave out what is too stale, and give every group a baseline (counted)."""
        if self._recorded is None:
            transitions, record["stale_dropped"] = self._drop_stale(transitions)
        leave_out = self.backend is not None and self.backend.group_baseline
        transitions = with_baselines(transitions, report, fold=self._recorded is not None, leave_out=leave_out)
        if not transitions:
            log.warning("step %d: no transitions with engine token ids; the backend is not called", record["step"])
        return transitions

    def _publish_trained(self, step: int, trained: list[Policy], ended: list[Rollout], state: dict[str, Any]) -> None:
        """The publish phase: each updated policy's new version served and recorded in the run's state."""
        for policy in trained:
            new = self._publish(step, policy)
            policy.version = new.version
            if policy.engine_name is None:
                state["model_version"] = new.version
        if self.policies.named:
            state["policy_versions"] = self.policies.versions()
        if self._recorded is not None:  # saved with the step: trained at most once, across restarts
            state.setdefault("trained_rollouts", []).extend(r.rollout_id for r in ended)

    def _update(
        self, transitions: list[Transition], step: int, calls: dict[str, int]
    ) -> tuple[list[Policy], dict[str, float]]:
        """Each trained policy's update from its own transitions: the policies updated, and the metrics
        (each policy's under ``policy/<name>/`` in a run of several; ``calls``: the calls each served)."""
        policies = self.policies
        mine = policies.split(transitions, per_rollout=self.config.transitions.normalize == "rollout")
        metrics: dict[str, float] = {}
        updated = []
        for p in policies.policies:
            ts = mine.get(p.name, [])
            if policies.prefixed:
                metrics[policies.metric(p, "calls")] = float(calls.get(p.name, 0))
                if p.config.train:
                    metrics[policies.metric(p, "transitions")] = float(len(ts))
                    if ts:
                        metrics[policies.metric(p, "reward_mean")] = sum(t.reward for t in ts) / len(ts)
            if p.backend is None or not ts:
                continue
            for key, value in p.backend.train_step(ts, step).items():
                metrics[policies.metric(p, key)] = value
            updated.append(p)
        return updated, metrics

    def _drop_stale(self, transitions: list[Transition]) -> tuple[list[Transition], int]:
        """Leave out the transitions more than ``max_staleness`` versions behind their learner (counted)."""
        bound = self.config.rollout.max_staleness
        kept = [t for t, behind in zip(transitions, self._staleness(transitions), strict=True) if behind <= bound]
        return kept, len(transitions) - len(kept)

    def _staleness(self, transitions: list[Transition]) -> list[int]:
        """How many versions each transition is behind the version its learner holds now.

        One code path for one policy and many: a policy that had nothing to learn from in a step
        kept its version, so an empty step makes nothing look older. A call no trained policy
        learns from (a frozen policy's), or made on a version the store does not know, counts 0.
        """
        steps = self._steps_of(transitions)
        held = {p.name: steps.get(p.version, 0) for p in self.policies.trained}
        learners = [self.policies.learner(t) for t in transitions]
        return [
            0 if p is None else held[p.name] - steps.get(t.model_version, held[p.name])
            for t, p in zip(transitions, learners, strict=True)
        ]

    def _check_capture(self, report: BuildReport) -> None:
        """Warn, once a run, when capture is on here and rollouts had gateway calls but no LLM span joined."""
        if self._capture_warned or not report.rollouts_without_spans:
            return
        capture = capture_switched_on()
        if capture:
            self._capture_warned = True
            log.warning(silent_capture_warning(capture, report.rollouts_without_spans, report.without_spans[0]))

    def _engine_counters(self) -> dict[str, int]:
        return self._engine.counters() if self._engine is not None else {}

    def _publish(self, step: int, policy: Policy) -> ModelVersion:
        gw = self.gateway
        if gw is not None:
            gw.pause()
        try:
            version = policy.backend.publish(step)
            if version.step is None:
                version = version.model_copy(update={"step": step})
            self._store.add_model_version(version)
            if gw is not None and gw.routes is not None:
                if self._engine is not None and policy.engine_name is not None:
                    gw.routes.set_upstream(policy.name, self._engine.policy_model(policy.engine_name))
                gw.routes.set_version(policy.name, version.version)
            if gw is not None and not self.policies.prefixed:
                gw.model_version = version.version
        finally:
            if gw is not None:
                gw.resume()
        self._remember_version(version.version, step)
        return version

    def evaluate(self, val: list[Task], step: int, state: dict[str, Any], label: str | None = None) -> dict[str, float]:
        """Run the ``val`` tasks once each (mode ``val``, never trained on) and return their ``val_*`` metrics."""
        rollouts = self.val_rollouts(f"val{step}", val, step, state, **self._resources_now())
        ended = self.run_rollouts(rollouts, f"eval {label or f'step {step}'}")
        return reward_metrics(self.val_finals(ended), ended, self.config.success_threshold, prefix="val_")

    def val_rollouts(
        self, tag: str, tasks: list[Task], step: int, state: dict[str, Any], **fields: Any
    ) -> list[Rollout]:
        """Mode ``val`` rollouts ``<run>-<tag>-<i>`` of ``tasks``, never trained on."""
        return [
            self._rollout(
                f"{rollout_prefix(state)}-{tag}-{i}",
                task,
                step,
                mode="val",
                seed=rollout_seed(self.config.seed, "val", task.task_id),  # the same before and after training
                model_version=state["model_version"],
                **fields,
            )
            for i, task in enumerate(tasks)
        ]

    def val_finals(self, ended: list[Rollout]) -> dict[str, float]:
        """Each ended val rollout's final reward as an evaluation reads it (a failed or unrewarded one: 0)."""
        val_cfg = self.config.transitions.model_copy(
            update={"agents": None, "missing_reward": 0.0, "failed_reward": 0.0}
        )
        builder = TransitionBuilder(self._store, val_cfg)
        for _ in builder.iter(ended):
            pass
        return builder.finals

    def run_rollouts(self, rollouts: list[Rollout], label: str) -> list[Rollout]:
        """Enqueue (idempotently) and wait until every rollout has ended."""
        cfg = self.config
        store = self._store
        store.enqueue(rollouts)
        ids = [r.rollout_id for r in rollouts]
        deadline = None if cfg.rollout.wait_timeout_s is None else time.monotonic() + cfg.rollout.wait_timeout_s
        last_expire = 0.0
        with self._progress() as progress:
            bar = progress.add_task(label, total=len(ids)) if progress is not None else None
            while True:
                current = list(store.query_rollouts(rollout_ids=ids))
                done = sum(r.status.terminal for r in current)
                if progress is not None:
                    progress.update(bar, completed=done)
                if done == len(ids):
                    break
                if self._runner_thread is not None and not self._runner_thread.is_alive():
                    raise RuntimeError("the in-process runner stopped unexpectedly")
                if deadline is not None and time.monotonic() > deadline:
                    pending = [r.rollout_id for r in current if not r.status.terminal]
                    store.cancel(pending)
                    log.warning(
                        "%s: cancelled %d rollout(s) still pending after %.0fs",
                        label,
                        len(pending),
                        cfg.rollout.wait_timeout_s,
                    )
                    break
                if time.monotonic() - last_expire > max(1.0, cfg.rollout.heartbeat_s):
                    store.expire(heartbeat_timeout_s=cfg.rollout.heartbeat_timeout_s)
                    last_expire = time.monotonic()
                time.sleep(0.05)
        self._settle()
        order = {rid: i for i, rid in enumerate(ids)}
        return sorted(store.query_rollouts(rollout_ids=ids), key=lambda r: order[r.rollout_id])

    def _settle(self) -> None:
        """Make sure the gateway's records of ended rollouts are in the store before they are read."""
        if self.gateway is not None:
            self.gateway.flush()
        elif self.config.gateway.url is not None and self.config.gateway.settle_s:
            time.sleep(self.config.gateway.settle_s)  # an external gateway writes its records every ~0.2 s

    def _progress(self):
        import contextlib

        if not self.config.progress or not self.console.is_terminal:  # a log file gets the step lines only
            return contextlib.nullcontext()
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )

    @staticmethod
    def _hook(name: str, **kwargs: Any) -> None:
        from agl.plugins import hook

        try:
            getattr(hook(), name)(**kwargs)
        except Exception as exc:  # a logger plugin failing must not stop training
            log.warning("hook %s failed: %s: %s", name, type(exc).__name__, exc)

    # -- the end -------------------------------------------------------------------------
    def _report(self, state: dict[str, Any], metrics: MetricsLog) -> TrainResult:
        records = metrics.read()
        curve = None
        if self.config.plot:
            curve = plot_reward_curve(records, self.workdir / "reward_curve.png")
            if curve is None:
                log.warning("matplotlib is not installed: no reward curve (pip install matplotlib)")
        rows = before_after(state.get("before"), state.get("after"))
        if rows:
            print_before_after(rows, self.console)
            (self.workdir / "before_after.md").write_text(before_after_markdown(rows))
        train = [r for r in records if r.get("kind") == "train"]
        if train:
            steps = f"{state['completed_step']} step" + ("" if state["completed_step"] == 1 else "s")
            done = f"trained {steps}" if self._backend is not None else f"ran {steps}, no backend: nothing trained"
            self.console.print(
                f"agl: {done}; final {final_versions(state['model_version'], state.get('policy_versions') or {})}; "
                f"train reward {train[0].get('reward_mean', 0):.3f} → {train[-1].get('reward_mean', 0):.3f}; "
                f"metrics in {self.workdir / 'metrics.jsonl'}" + (f"; reward curve {curve}" if curve else ""),
                soft_wrap=True,
            )
        return TrainResult(
            steps_completed=state["completed_step"],
            model_version=state["model_version"],
            policy_versions=dict(state.get("policy_versions") or {}),
            history=records,
            before=state.get("before"),
            after=state.get("after"),
            reward_curve=curve,
        )


__all__ = ["TrainResult", "Trainer", "as_tasks", "load_tasks_jsonl"]
