"""The trainer's configuration, loadable from YAML, JSON or TOML.

Every field has a default except what only the user knows (the backend and the
model live in ``backend.config``). A file may hold the config at its top level or
under a ``trainer`` key. Unknown keys are errors that name the key, so a typo
never silently falls back to a default.

.. code-block:: yaml

    workdir: runs/sql-agent
    steps: 20
    batch_size: 8          # tasks per step
    n_rollouts: 4          # rollouts per task (the group)
    val_every: 5
    transitions: {credit: emitted, agents: [writer]}
    rollout: {concurrency: 8, max_response_tokens: 256}
    backend: {name: verl, config: {model: ./my-model, mode: local}}
    engine: {name: transformers, config: {model: ./my-model}}
    loggers: [tensorboard, {name: wandb, project: sql-agent}]
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agl.env import STORE_URL
from agl.errors import ConfigError
from agl.schema import GRADER_SOURCES
from agl.store.base import default_store_url, sqlite_path, sqlite_url
from agl_trainer.policy_config import PolicyConfig, check_policies
from agl_trainer.transitions import TransitionConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

Overrides = Mapping[str, Any] | Iterable[str]
"""Dotted overrides: a dotlist (``["rollout.concurrency=8"]``) or a mapping (``{"rollout.concurrency": 8}``)."""

_KEY = re.compile(r"[\w-]+(\.[\w-]+)*")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComponentConfig(_Config):
    """A plugin component: its registry name and its own config."""

    name: str = Field(min_length=1, description="the name a plugin registered it under (agl plugins lists them)")
    config: dict[str, Any] = Field(default_factory=dict, description="its own settings, passed to its factory")


class LoggerConfig(BaseModel):
    """An experiment-tracker logger (:mod:`agl_trainer.loggers`): its name and its own options, side by side.

    ``{name: wandb, project: sql-agent}``; a bare name (``tensorboard``) is a logger with its defaults.
    """

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="tensorboard or wandb")

    @model_validator(mode="after")
    def _known(self) -> LoggerConfig:
        from agl_trainer.loggers import check_options

        check_options(self.name, self.model_extra or {})
        return self


class GatewayConfig(_Config):
    """The model gateway: started in-process unless ``url`` names a running one."""

    url: str | None = Field(default=None, description="root URL of a running gateway (http://host:port)")
    token: str | None = Field(default=None, description="its bearer token (a random one for an in-process gateway)")
    port: int = Field(default=0, ge=0, lt=65536, description="port for the in-process gateway (0: any free one)")
    settle_s: float = Field(
        default=1.0, ge=0, description="wait after a batch ends for an external gateway's buffered records to land"
    )


class RolloutConfig(_Config):
    """How rollouts run."""

    runners: Literal["inprocess", "external"] = Field(
        default="inprocess", description="'external': `agl runner` processes claim the rollouts"
    )
    concurrency: int = Field(default=4, ge=1, description="rollouts at once in the in-process runner")
    timeout_s: float | None = Field(default=300.0, gt=0, description="per-rollout timeout")
    max_response_tokens: int | None = Field(
        default=None,
        ge=1,
        description="the gateway ends every response of a rollout after this many tokens, whatever the "
        "agent asked for (verl's response_length); None leaves only the agent's own limit and the context",
    )
    max_attempts: int = Field(default=2, ge=1, description="attempts per rollout (retry policy)")
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="asynchronous training: the rollouts of the next k steps are queued and run while a step "
        "trains, against the weights published last; a transition more than k versions behind the learner "
        "is dropped (counted as stale_dropped). 0: lockstep, each step's rollouts on the newest weights",
    )
    heartbeat_s: float = Field(
        default=5.0,
        gt=0,
        description="seconds between the in-process runner's heartbeats, and at least between the trainer's "
        "checks for silent runners",
    )
    heartbeat_timeout_s: float = Field(
        default=60.0, gt=0, description="a silent runner's rollouts are taken back after this"
    )
    wait_timeout_s: float | None = Field(default=None, gt=0, description="give up on a step's rollouts after this")
    model: str = Field(default="agl-policy", description="model name given to the agent")
    resources: dict[str, Any] = Field(default_factory=dict, description="given to the agent as ctx.resources")


class FromStoreConfig(_Config):
    """Training on rollouts the trainer did not generate: production traffic, ``agl run``, other runs."""

    modes: list[Literal["train", "val", "production"]] = Field(
        default_factory=lambda: ["production"], description="the rollouts' modes to train on"
    )
    since: float | None = Field(default=None, description="created at or after (epoch seconds)")
    until: float | None = Field(default=None, description="created before (epoch seconds)")
    task_ids: list[str] | None = Field(default=None, description="only rollouts of these tasks")
    rewarded_only: bool = Field(
        default=True,
        description="only graded rollouts: with a stored final reward ('reward') of a graded_by source, unless a "
        "reward plugin is registered, which rewards every rollout",
    )
    graded_by: list[str] | None = Field(
        default_factory=lambda: sorted(GRADER_SOURCES),
        description="the reward sources that count as a grade for rewarded_only: by default human and user, which "
        "only a credential agents do not hold may write; null: any, the agent's own rewards too",
    )
    rollouts_per_step: int = Field(default=32, ge=1, description="rollouts trained on per step")
    wait_s: float = Field(
        default=0.0, ge=0, description="how long a step waits for new rollouts before the run ends early"
    )


class FilterGroupsConfig(_Config):
    """Dynamic sampling as verl's DAPO recipe does it (``algorithm.filter_groups``): train only on groups
    with a reward signal, generating more batches of new tasks until ``batch_size`` such groups are kept."""

    enable: bool = Field(
        default=False,
        description="keep only the groups (one task's n_rollouts rollouts in a step) whose metric is not the same "
        "for all of them; while fewer than batch_size are kept, run the next batch_size tasks of the shuffle "
        "too; train on the first batch_size kept (verl's filter_groups.enable). Dropped groups' rollouts stay "
        "in the store, untrained",
    )
    metric: Literal["reward"] = Field(
        default="reward",
        description="what must vary within a group: 'reward', each rollout's final reward as its transitions "
        "carry it (verl's canonical 'reward'); a rollout without transitions takes no part",
    )
    max_gen_batches: int = Field(
        default=0,
        ge=0,
        description="at most this many generation batches a step; the step stops with an error when they keep "
        "fewer than batch_size groups (verl's max_num_gen_batches). 0: no limit",
    )


class TrainerConfig(_Config):
    """Everything :class:`agl.Trainer` needs besides the agent and the tasks."""

    workdir: Path = Field(default=Path(".agl/run"), description="checkpoints, metrics, plots")
    store: str | None = Field(
        default=None, description=f"store URL (default: ${STORE_URL}, else .agl/agl.db, where the agl commands look)"
    )
    steps: int = Field(default=10, ge=1, description="training steps")
    batch_size: int = Field(default=8, ge=1, description="tasks per step")
    n_rollouts: int = Field(default=4, ge=1, description="rollouts per task (the group)")
    seed: int = Field(
        default=0, description="the run's seed: the order tasks are batched in and each rollout's sampling seed"
    )
    shuffle: bool = Field(
        default=True,
        description="batch the train tasks in a seeded shuffle, epoch after epoch (verl's data.shuffle); false: "
        "in the order given, from the first again after the last (a curriculum is an order of tasks)",
    )
    val_every: int = Field(
        default=0, ge=0, description="evaluate on the val split every k steps (0: only before/after)"
    )
    val_before: bool = Field(default=True, description="evaluate before the first step (the 'before' of the table)")
    val_max_tasks: int | None = Field(default=None, ge=1, description="evaluate on at most this many val tasks")
    val_temperature: float = Field(default=0.0, ge=0, description="given to val rollouts as resources['temperature']")
    success_threshold: float = Field(default=1.0, description="a rollout whose final reward reaches this is a success")
    plugins: list[str] = Field(
        default_factory=list,
        description="plugins to register before training, e.g. a reward: 'my_rewards', 'rewards.py' or "
        "'module:attribute' (installed packages register theirs through the 'agl' entry point)",
    )
    loggers: list[LoggerConfig] = Field(
        default_factory=list,
        description="experiment trackers to log each step to: tensorboard (<workdir>/tensorboard), wandb "
        "(offline, <workdir>/wandb); a name, or {name: ..., <its options>}",
    )
    transitions: TransitionConfig = Field(
        default_factory=TransitionConfig, description="how rollouts become transitions (credit, filters, rewards)"
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="how rollouts run")
    filter_groups: FilterGroupsConfig = Field(
        default_factory=FilterGroupsConfig,
        description="dynamic sampling (verl's DAPO filter_groups): train only on groups with a reward signal",
    )
    from_store: FromStoreConfig | None = Field(
        default=None,
        description="train on rollouts already in the store (recorded traffic) instead of generating them; "
        "each is trained on at most once per run",
    )
    policies: list[PolicyConfig] = Field(
        default_factory=list,
        description="the run's policies: each answers the model names it lists, trains on its own calls (or is "
        "frozen) with its own backend, optimizer and versions; none given: one policy answers every call",
    )
    resources: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="named text resources the agent reads from ctx.resources (a system prompt, a template; a list "
        "of texts for few-shot examples): version r0, put on every rollout; a backend such as apo changes them",
    )
    backend: ComponentConfig | None = Field(default=None, description="the algorithm backend (registry name + config)")
    engine: ComponentConfig | None = Field(default=None, description="the inference engine started in-process")
    engine_urls: list[str] = Field(default_factory=list, description="base URLs of running engine replicas instead")
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="the model gateway: in-process unless gateway.url names one"
    )
    plot: bool = Field(default=True, description="write reward_curve.png at the end (needs matplotlib)")
    progress: bool = Field(default=True, description="show progress bars (on a terminal; a log file gets none)")

    @field_validator("loggers", mode="before")
    @classmethod
    def _logger_names(cls, value: Any) -> Any:
        """A bare name stands for ``{name: <it>}``; each logger at most once."""
        if not isinstance(value, list):
            return value
        entries = [{"name": v} if isinstance(v, str) else v for v in value]
        names = [e.get("name") if isinstance(e, Mapping) else getattr(e, "name", None) for e in entries]
        twice = sorted({n for n in names if n is not None and names.count(n) > 1})
        if twice:
            raise ValueError(f"{', '.join(map(repr, twice))} given more than once (one entry per logger)")
        return entries

    @model_validator(mode="after")
    def _one_engine_source(self) -> TrainerConfig:
        if self.engine is not None and self.engine_urls:
            raise ValueError("engine and engine_urls: give one of them, not both")
        check_policies(self.policies)
        self._check_filter_groups()
        return self

    def _check_filter_groups(self) -> None:
        """Refuse what dynamic sampling cannot be honoured with: it decides a step's tasks from its rollouts."""
        if not self.filter_groups.enable:
            return
        if self.rollout.max_staleness > 0:
            raise ValueError(
                f"filter_groups.enable: cannot be used with rollout.max_staleness {self.rollout.max_staleness}: "
                "a step's later generation batches depend on its first one's rewards, so the batches of future "
                "steps cannot be queued ahead; set rollout.max_staleness: 0"
            )
        if self.from_store is not None:
            raise ValueError(
                "filter_groups.enable: cannot be used with from_store: recorded traffic has no groups to "
                "generate again; leave filter_groups off"
            )
        if self.n_rollouts < 2:
            raise ValueError(
                f"filter_groups.enable: needs n_rollouts of 2 or more, not {self.n_rollouts}: a group of one "
                "rollout has no spread of rewards to filter on (verl keeps every such group)"
            )
        trained = [p.name for p in self.policies if p.train]
        if len(trained) > 1:
            raise ValueError(
                f"filter_groups.enable: cannot be used with several trained policies ({', '.join(trained)}): a group "
                "is kept for the spread of its rollouts' rewards, and a policy whose calls come in only some of "
                "those rollouts may get none of that spread in its own transitions; train one policy (the others "
                "train: false), or leave filter_groups off"
            )

    def store_url(self) -> str:
        """``store``, else the store every ``agl`` command uses (:func:`agl.store.base.default_store_url`).

        A relative SQLite path is made absolute, so that processes started elsewhere (verl's
        workers) find the same file.
        """
        url = self.store or default_store_url()
        if "://" not in url or url.lower().startswith("sqlite:"):
            return sqlite_url(sqlite_path(url))
        return url


def _explain(exc: ValidationError, source: str) -> ConfigError:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: {unknown_key(TrainerConfig, err['loc'])}")
        else:
            lines.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
    return ConfigError(f"{source}: " + "; ".join(lines))


def unknown_key(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """Why the key at ``loc`` (in data for ``model``) is refused, naming the key it most likely
    meant: ``not a config key (did you mean rollout.concurrency?)``."""
    *parents, key = loc
    fields = _fields_at(model, parents)
    if not fields:
        return "not a config key"
    close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
    if close:
        return f"not a config key (did you mean {'.'.join([*map(str, parents), close[0]])}?)"
    return f"not a config key (the keys there: {', '.join(fields)})"


def _fields_at(model: type[BaseModel], path: Iterable[int | str]) -> list[str]:
    """The field names of the model at ``path`` inside ``model`` (list indexes skipped); none
    when ``path`` leads to something that is not a model (a plugin's free-form options)."""
    current: type[BaseModel] | None = model
    for part in path:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
    return list(current.model_fields) if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model ``annotation`` holds (itself, or inside ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, typing.get_args(annotation)) if m is not None), None)


def parse_config(data: dict[str, Any], source: str = "config") -> TrainerConfig:
    """Validate a config dict; errors name the field and the reason."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    if set(data) == {"trainer"}:
        data = data["trainer"]
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, source) from None


def load_config(path: str | Path, overrides: Overrides | None = None) -> TrainerConfig:
    """Read a config file (``.yaml``/``.yml``, ``.json`` or ``.toml``), then apply dotted ``overrides``.

    ``overrides`` are those of :func:`apply_overrides`: ``KEY=VALUE`` strings (YAML-typed values) or a mapping.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            raise ConfigError(f"config: {path}: unknown format {suffix!r} (use .yaml, .json or .toml)")
    except ConfigError:
        raise
    except Exception as exc:  # each parser raises its own error type
        raise ConfigError(f"config: {path} does not parse: {exc}") from None
    if overrides:
        data = apply_overrides(data if isinstance(data, dict) else {}, overrides)
    return parse_config(data, str(path))


def apply_overrides(data: Mapping[str, Any], overrides: Overrides) -> dict[str, Any]:
    """A copy of ``data`` with dotted overrides applied, in order, by OmegaConf.

    A dotlist item ``KEY=VALUE`` has its value parsed as YAML (``8``, ``true``, ``[a, b]``,
    ``{x: 1}``; an empty value is null); a mapping's values are taken as given. A dict value
    merges into the dict it overrides, any other value replaces what was there. Strings are
    kept as written (no ``${...}`` interpolation). A malformed item is a :class:`ConfigError`
    naming it; an unknown field is caught later, by :func:`parse_config`, which names it too.
    """
    from omegaconf import OmegaConf  # imported here: importing agl_trainer stays ~60 ms faster
    from omegaconf.errors import OmegaConfBaseException

    merged = OmegaConf.create(_plain(data))
    for key, patch in _patches(overrides):
        try:
            merged = OmegaConf.merge(merged, patch)
        except OmegaConfBaseException as exc:
            reason = str(exc).splitlines()[0]
            raise ConfigError(f"override {key!r}: does not fit the config ({reason})") from None
    return OmegaConf.to_container(merged, resolve=False)  # type: ignore[return-value]


def _patches(overrides: Overrides) -> Iterator[tuple[str, DictConfig]]:
    """Each override as (its key, a config holding just it)."""
    import yaml
    from omegaconf import OmegaConf

    if isinstance(overrides, str):
        overrides = [overrides]
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            patch = OmegaConf.create()
            OmegaConf.update(patch, _checked_key(key), _plain(value), merge=True)
            yield key, patch
        return
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE")
        try:
            patch = OmegaConf.from_dotlist([f"{_checked_key(key)}={value}"])
        except yaml.YAMLError as exc:
            reason = getattr(exc, "problem", None) or exc
            raise ConfigError(f"override {key!r}: {value!r} is not a YAML value ({reason})") from None
        yield key, patch


def _checked_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ConfigError(f"override {key!r}: a key is dot-separated names, e.g. rollout.concurrency")
    return key


def _plain(value: Any) -> Any:
    """A JSON-only copy (dates, paths and other objects as strings), which OmegaConf can hold."""
    return json.loads(json.dumps(value, default=str))


__all__ = [
    "ComponentConfig",
    "FilterGroupsConfig",
    "GatewayConfig",
    "LoggerConfig",
    "Overrides",
    "RolloutConfig",
    "TrainerConfig",
    "apply_overrides",
    "load_config",
    "parse_config",
]
