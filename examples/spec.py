"""What a tool-using example supplies to the shared runner (:mod:`examples.training`, :mod:`examples.evaluation`).

An example's ``spec.py`` builds one :class:`ExampleSpec`: its agent, its data splits and
the option that picks part of them, its reward plugin, how it scores a split, and how
its trainer config and its results file differ from the others'.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Subset:
    """The option that picks part of a split by one field of its tasks (``--operations 2``, ``--hops 1``).

    ``select(tasks, values)`` returns the tasks of those values and raises ``ValueError``
    starting with ``<option>:`` for a value that is not one (the runner prefixes ``--``).
    """

    option: str
    values: str
    """What the values are, in words: ``numbers of operations``."""
    default: tuple
    select: Callable[[list[dict], tuple], list[dict]]
    type: Callable[[str], Any] = int
    choices: Sequence | None = None

    def add_to(self, parser: argparse.ArgumentParser, noun: str, *, training: bool) -> None:
        """``--<option>``: the training tasks (default: the config's), or an evaluation's filter (default: all)."""
        what = f"train on the train split's {noun}" if training else f"only {noun}"
        parser.add_argument(
            f"--{self.option}",
            type=self.type,
            nargs="+",
            choices=self.choices,
            default=list(self.default) if training else None,
            help=f"{what} of these {self.values}",
        )


@dataclass(frozen=True)
class ExampleSpec:
    """One example, as the shared runner needs it.

    ``package`` (``examples.calc_agent``) names the example; the runner finds its parts in
    it by their module names: the agent ``agent.<name>`` (``calc_agent.agent.calc_agent``),
    the reward plugin ``rewards``, the trainer config ``config`` (``trainer_config`` and its
    ``DEFAULTS``: steps, batch size, rollouts per task, response cap) and the evaluation
    ``evaluation`` (``summarize(rollouts, tasks, store)`` and ``run_split(items, *,
    model_path, workdir, ...)``). The fields say what differs between the examples.
    """

    package: str
    noun: str
    """What a task is, in the plural (``problems``, ``questions``): options' help and ``eval_<noun>``."""
    reward_plugin: str
    """The name the reward plugin is registered under."""
    load_split: Callable[[str], list[dict]]
    train_figures: Callable[..., dict[str, Any]]
    """``train_figures(store, rollouts)``: what the results file keeps of the training rollouts."""
    subset: Subset
    trainer_config: Callable[..., dict[str, Any]]
    """``trainer_config(args, seed=, workdir=, model_path=, steps=, batch_size=, n_rollouts=,
    max_response_tokens=)``: the trainer config of one run (``args``: the parsed options)."""
    arm: Callable[[argparse.Namespace], str]
    """The run's name (``calc_agent-lr0.001``): ``<arm>-seed<N>.json`` is its results file."""
    score: str = "success"
    """The summary's headline figure (``success``, ``f1``), printed before -> after."""
    curve: tuple[str, str] = ("train_success_by_step", "success_rate")
    """The results file's per-step training curve and the metric of ``metrics.jsonl`` it holds."""
    arm_key: str = "name"
    """The results file's key for :attr:`arm`."""
    record_extras: Callable[[argparse.Namespace, list[dict]], dict[str, Any]] = field(default=lambda args, train: {})
    """What else the results file records of the run's options and its training tasks."""
    options: Callable[[argparse.ArgumentParser], None] = _nothing
    """Options both commands take (the SQL agent's ``--db``)."""
    train_options: Callable[[argparse.ArgumentParser], None] = _nothing
    """Options only training takes (``--lr``, ``--arm``)."""
    task_order: Callable[[argparse.Namespace, list[dict]], list[dict] | None] = _nothing
    """``task_order(args, train)``: the training tasks in the order the steps take them, a batch after
    another (a curriculum; the trainer then does not shuffle), or None for the trainer's seeded shuffle."""
    reward: Callable[[argparse.Namespace], tuple[str, Any] | None] = _nothing
    """``reward(args)``: the reward plugin an option picks and its name (the calculator's
    ``--operand-credit``), or None for the ``rewards`` module under :attr:`reward_plugin`."""
    prepare: Callable[[argparse.Namespace], None] = _nothing
    """Checks and settings from the options, before anything runs (the SQL agent's database); a
    ``ValueError`` or ``OSError`` it raises is the command's usage error."""

    @property
    def name(self) -> str:
        """The package's own name (``calc_agent``): its folder, and the results files' default arm."""
        return self.package.rsplit(".", 1)[-1]

    @property
    def runs(self) -> str:
        """The folder under ``runs/`` that its work directories go to (``calc-agent``)."""
        return self.name.replace("_", "-")

    def part(self, module: str) -> ModuleType:
        """The example's module ``module`` (``config``, ``evaluation``, ``rewards``, ``agent``)."""
        return importlib.import_module(f"{self.package}.{module}")

    @property
    def agent(self) -> Callable:
        """The agent function (``agent.<name>``)."""
        return getattr(self.part("agent"), self.name)

    @property
    def defaults(self) -> dict[str, int]:
        """The config's ``steps``, ``batch_size``, ``n_rollouts`` and ``max_response_tokens``."""
        return self.part("config").DEFAULTS

    def summarize(self, rollouts: list, tasks: dict[str, dict], store: Any = None) -> dict[str, Any]:
        """The example's figures over ended rollouts (``evaluation.summarize``)."""
        return self.part("evaluation").summarize(rollouts, tasks, store)

    def run_split(self, items: list[dict], **options: Any) -> dict[str, Any]:
        """The agent on a split outside training, summarized (``evaluation.run_split``)."""
        return self.part("evaluation").run_split(items, **options)

    def prepare_or_exit(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        """:attr:`prepare` the parsed options; a ``ValueError`` or ``OSError`` it raises is ``parser``'s usage error."""
        try:
            self.prepare(args)
        except (ValueError, OSError) as exc:
            parser.error(str(exc))

    def register_reward(self, args: argparse.Namespace | None = None) -> None:
        """Register the reward plugin once (the user's way: ``agl.register_plugin``): the one the
        options pick (:attr:`reward`), else the ``rewards`` module."""
        import agl
        from agl.plugins import get_plugin_manager

        name, plugin = (self.reward(args) if args is not None else None) or (self.reward_plugin, self.part("rewards"))
        if get_plugin_manager().get_plugin(name) is None:
            agl.register_plugin(plugin, name=name)
