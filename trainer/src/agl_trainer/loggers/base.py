"""What every experiment-tracker logger shares: the ``agl_step_ended`` plugin, metric names, and failing safely.

A :class:`Logger` is a plugin object: the trainer registers one per entry of the
config's ``loggers`` list, and pluggy calls its ``agl_step_ended`` after each
training step. A subclass writes; this base decides what to write and makes sure
a tracker that breaks (its library raises, the disk fills up) costs one warning
and nothing else: from its first failure on, that logger is switched off for the
rest of the run, and training goes on.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

import agl

log = logging.getLogger("agl_trainer.loggers")

_GROUPS = ("val", "time", "build")
# a key naming a secret: "token", "hf_token", "api_key", "client-secret", but not "tokenizer_path"
_SECRET_KEY = re.compile(r"(^|[_-])(token|api_?key|password|passwd|secret)($|[_-])", re.IGNORECASE)


class LoggerOptions(BaseModel):
    """A logger's own options (the keys of its ``loggers`` entry besides ``name``); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class RunInfo:
    """What a logger is told when the run starts."""

    run_id: str
    """agl's run id (``run-…``), the same across resumes of one run."""
    workdir: Path
    """The run's workdir: where a logger writes unless its options say otherwise."""
    config: dict[str, Any] = field(default_factory=dict)
    """The trainer config as plain JSON values, secrets replaced by ``***`` (see :func:`redacted`)."""
    first_step: int = 1
    """The first training step this process runs (more than 1 on a resumed run)."""


def metric_name(key: str) -> str:
    """The tracker's name for a step-record key, grouped the way TensorBoard and W&B show sections.

    ``val_reward_mean`` → ``val/reward_mean``, ``time_rollout_s`` → ``time/rollout_s``,
    ``build_rollouts_skipped`` → ``build/rollouts_skipped``, any other key → ``train/<key>``;
    a key that holds a ``/`` already (``actor/pg_loss``) is kept as it is.
    """
    if "/" in key:
        return key
    group, sep, rest = key.partition("_")
    if sep and rest and group in _GROUPS:
        return f"{group}/{rest}"
    return f"train/{key}"


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a step record, under their :func:`metric_name`, as floats.

    ``step`` is the step itself, not a metric; strings (``kind``, ``model_version``),
    booleans, None and nested values are left out.
    """
    out = {}
    for key, value in metrics.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[metric_name(key)] = float(value)
    return out


def redacted(value: Any) -> Any:
    """A copy of a JSON-like config with secrets hidden: values of keys naming a token, key, password
    or secret, and the password part of URLs, become ``***``."""
    if isinstance(value, Mapping):
        return {
            k: "***" if _SECRET_KEY.search(str(k)) and isinstance(v, str) and v else redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        from agl_trainer.cli.run import hide_password

        try:
            return hide_password(value)
        except ValueError:  # not a URL after all (a bad port, say): keep nothing of it
            return "***"
    return value


class Logger(ABC):
    """An experiment-tracker logger, registered as an ``agl`` plugin for the length of one run.

    Subclasses set :attr:`name` and :attr:`options_model` and implement :meth:`open`,
    :meth:`write` and :meth:`close`; they may raise anything, which this class turns
    into one warning. ``agl_step_ended`` is the only hook it implements.
    """

    name: str = ""
    """The name in the config's ``loggers`` list."""
    options_model: type[LoggerOptions] = LoggerOptions
    """The model of its options."""
    package: str = ""
    """The Python package its library is imported as (checked before training starts; empty: none)."""
    extra: str = ""
    """The agl-trainer extra that installs that library (``pip install 'agl-trainer[<extra>]'``), if one does."""

    @classmethod
    def install_hint(cls) -> str:
        """The pip command that installs this logger's library (empty when it names none)."""
        if cls.extra:
            return f"pip install 'agl-trainer[{cls.extra}]'"
        return f"pip install {cls.package}" if cls.package else ""

    def __init__(self, options: LoggerOptions | Mapping[str, Any] | None = None):
        if not isinstance(options, LoggerOptions):
            options = self.options_model.model_validate(dict(options or {}))
        self.options = options
        self.failed: BaseException | None = None
        """What made this logger stop, if it did (it then writes nothing more)."""
        self.run: RunInfo | None = None
        self._opened = False

    # -- what a subclass writes ------------------------------------------------------------
    @abstractmethod
    def open(self, run: RunInfo) -> None:
        """Start writing for ``run``, and log its config once."""

    @abstractmethod
    def write(self, step: int, values: dict[str, float]) -> None:
        """Write ``values`` (named by :func:`metric_name`) at ``step``."""

    def close(self, failed: bool = False) -> None:
        """Flush and release what :meth:`open` took; ``failed``: the training run ended with an error."""

    # -- what the trainer calls ------------------------------------------------------------
    def start(self, run: RunInfo) -> None:
        """Open for ``run``; a failure is the one warning, and the logger stays off."""
        self.run = run
        self._opened = self._guard("start", lambda: self.open(run))

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write a step record's numeric values at ``step`` (also used for the before/after evaluations)."""
        if not self._opened or self.failed is not None:
            return
        values = scalars(metrics)
        if values:
            self._guard(f"step {step}", lambda: self.write(step, values))

    def finish(self, failed: bool = False) -> None:
        """Close (once; later calls do nothing); a failure here is the one warning too (when there was none before).

        ``failed``: the training run ended with an error (W&B then marks the run failed).
        """
        if self._opened:
            self._opened = False
            self._guard("close", lambda: self.close(failed))

    @agl.hookimpl
    def agl_step_ended(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the training step's metrics (never raises)."""
        self.log_metrics(step, metrics)

    def _guard(self, what: str, action: Callable[[], None]) -> bool:
        if self.failed is not None:
            return False
        try:
            action()
        except Exception as exc:
            self.failed = exc
            log.warning(
                "logger %r failed at %s (%s: %s); it logs nothing more in this run, training goes on",
                self.name,
                what,
                type(exc).__name__,
                exc,
            )
            if what != "close":
                self._close_quietly()
            return False
        return True

    def _close_quietly(self) -> None:
        self._opened = False
        try:
            self.close()
        except Exception as exc:  # already warned once for this logger
            log.debug("logger %r: close after failure: %s", self.name, exc)


__all__ = ["Logger", "LoggerOptions", "RunInfo", "metric_name", "redacted", "scalars"]
