"""Experiment-tracker loggers: TensorBoard and Weights & Biases, switched on in the trainer config.

.. code-block:: yaml

    loggers: [tensorboard, wandb]                 # <workdir>/tensorboard, <workdir>/wandb (offline)
    loggers:
      - tensorboard
      - {name: wandb, project: sql-agent, mode: online}

Each entry is a name, or a mapping with ``name`` and that logger's options
(:class:`~agl_trainer.loggers.tensorboard.TensorBoardOptions`,
:class:`~agl_trainer.loggers.wandb.WandbOptions`). A name is looked up among the
loggers plugins register (``agl_register_loggers``); the two here are registered
that way too, as a built-in plugin, ``trylast`` so that a plugin may replace one. The trainer makes one
:class:`~agl_trainer.loggers.base.Logger` per entry and registers it as an ``agl``
plugin on ``agl_step_ended`` for the length of the run; it also hands them the
before/after evaluations (at step 0 and at the last training step, as in ``metrics.jsonl``).
Their libraries are extras: ``pip install 'agl-trainer[tensorboard,wandb]'``.

A logger of your own can be registered the same way (a :class:`Logger` subclass),
or be any plugin with an ``agl_step_ended`` hook (``plugins: [my_logger]``): it sees
the same records.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from agl.errors import ConfigError
from agl.hookspecs import Register, hookimpl
from agl.plugins import resolve
from agl_trainer.loggers.base import Logger, LoggerOptions, RunInfo, metric_name, redacted, scalars
from agl_trainer.loggers.tensorboard import TensorBoardLogger
from agl_trainer.loggers.wandb import WandbLogger

BUILTIN: tuple[type[Logger], ...] = (TensorBoardLogger, WandbLogger)
"""agl-trainer's own loggers."""


@hookimpl(trylast=True)
def agl_register_loggers(register: Register) -> None:
    """The built-in loggers; asked last, so a plugin can register one of the same name."""
    for cls in BUILTIN:
        register(cls.name, cls, description=cls.install_hint())


def logger_class(name: str) -> type[Logger]:
    """The logger class registered as ``name``; a ValueError names the unknown logger and what is installed."""
    try:
        cls = resolve("logger", name)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, Logger)):
        raise ValueError(f"logger {name!r}: its plugin registered {cls!r}, not a Logger subclass")
    return cls


def check_options(name: str, options: Mapping[str, Any]) -> LoggerOptions:
    """The options of logger ``name``, validated; a ValueError names the unknown logger or the bad option."""
    cls = logger_class(name)
    try:
        return cls.options_model.model_validate(dict(options))
    except ValidationError as exc:
        problems = "; ".join(
            f"option {'.'.join(str(p) for p in err['loc']) or name!r}: {err['msg']}" for err in exc.errors()
        )
        raise ValueError(f"logger {name!r}: {problems}") from None


def build_loggers(entries: Sequence[Any]) -> list[Logger]:
    """One logger per config entry (``LoggerConfig`` objects, mappings or names), in order.

    A :class:`~agl.errors.ConfigError` names the entry (``loggers[1]``) when the logger is
    unknown, an option is wrong, or its library is not installed (with the pip command).
    """
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            name, options = entry, {}
        else:
            data = entry if isinstance(entry, Mapping) else entry.model_dump()
            name, options = data.get("name", ""), {k: v for k, v in data.items() if k != "name"}
        try:
            checked = check_options(name, options)
        except ValueError as exc:
            raise ConfigError(f"loggers[{i}]: {exc}") from None
        cls = logger_class(name)
        if cls.package and importlib.util.find_spec(cls.package) is None:
            raise ConfigError(
                f"loggers[{i}]: the {name!r} logger needs the {cls.package} package, which is not installed: "
                + cls.install_hint()
            )
        out.append(cls(checked))
    return out


__all__ = [
    "BUILTIN",
    "Logger",
    "LoggerOptions",
    "RunInfo",
    "TensorBoardLogger",
    "WandbLogger",
    "build_loggers",
    "check_options",
    "logger_class",
    "metric_name",
    "redacted",
    "scalars",
]
