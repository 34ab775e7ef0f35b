"""agl: train any LLM agent with reinforcement learning, without rewriting it.

The public API a user or an integration needs is importable from here::

    import agl

    agl.emit_reward(1.0)                    # inside an agent
    with agl.span("retrieve", kind="tool"):  # structure of your own
        ...

    @agl.hookimpl
    def agl_reward(rollout, spans, llm_calls, rewards):   # a reward plugin
        return float(rollout.output == rollout.task.input["answer"])
"""

from typing import TYPE_CHECKING

from agl.capture import (
    BufferedWriter,
    RolloutContext,
    annotate,
    current_rollout,
    emit_reward,
    emit_span,
    span,
    use_rollout,
)
from agl.schema import Attempt, LLMCall, ModelVersion, Reward, Rollout, RolloutStatus, Span, Task, Transition
from agl.store import Store, open_store

if TYPE_CHECKING:  # imported lazily at run time (below); named here for type checkers and the API reference
    from agl.hookspecs import hookimpl
    from agl.plugins import register as register_plugin
    from agl.runner import RolloutResult, Runner

__version__ = "0.1.0"

_LAZY = {
    "Runner": ("agl.runner", "Runner"),
    "RolloutResult": ("agl.runner", "RolloutResult"),
    # The plugin registry (and pluggy): for plugins and the training side; capture never loads it.
    "hookimpl": ("agl.hookspecs", "hookimpl"),
    "register_plugin": ("agl.plugins", "register"),
}

# Names that live in agl-trainer, the package for the training side.
_MOVED = {"Trainer": "agl_trainer", "TrainerConfig": "agl_trainer"}


def __getattr__(name: str):
    """The runner and the plugin API, imported on first use so ``import agl`` stays light inside agents."""
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    if name in _MOVED:
        raise AttributeError(
            f"agl.{name} is part of agl-trainer: `pip install agl-trainer`, then `from {_MOVED[name]} import {name}`"
        )
    raise AttributeError(f"module 'agl' has no attribute {name!r}")


__all__ = [
    "Attempt",
    "BufferedWriter",
    "LLMCall",
    "ModelVersion",
    "Reward",
    "Rollout",
    "RolloutContext",
    "RolloutResult",
    "RolloutStatus",
    "Runner",
    "Span",
    "Store",
    "Task",
    "Transition",
    "annotate",
    "current_rollout",
    "emit_reward",
    "emit_span",
    "hookimpl",
    "open_store",
    "register_plugin",
    "span",
    "use_rollout",
]
