"""``VerlBackend``: agl's :class:`~agl_trainer.backend.Backend` on verl's algorithms.

``mode="local"`` (the default) trains a transformers model in this process, on
the CPU or one GPU (:mod:`agl_verl.local`). ``mode="distributed"`` hands the
whole loop to verl's own Ray trainer with vLLM rollout servers
(:mod:`agl_verl.distributed`); there verl drives the steps, so
:meth:`VerlBackend.train_step` is not used and :meth:`VerlBackend.run_distributed`
starts the job.

Threads (local mode): the learner runs on the calling thread with torch's thread count for
the process (one per core, or ``$OMP_NUM_THREADS``, or what the caller set with
``torch.set_num_threads`` / :func:`agl_verl.threads.set_torch_threads` before the first
update), and its OpenMP workers sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, set
when agl_verl is imported: :mod:`agl_verl.threads`). In local training the engine's batcher
thread and the learner take turns, each with its own OpenMP team of that size, so neither
is given fewer threads: with the passive policy the team that waits costs nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agl.errors import AglError
from agl.schema import ModelVersion, Transition
from agl_trainer.backend import STANDALONE, Backend, BackendContext
from agl_trainer.engine import Engine
from agl_verl.config import VerlSettings, parse_settings
from agl_verl.quiet import import_verl_quietly

import_verl_quietly()  # before agl_verl.local, .dataproto and .distributed import verl

BATCH_BASELINE_ESTIMATORS = frozenset({"reinforce_plus_plus"})
"""verl's estimators (of those agl runs) whose baseline is the batch's, not each task group's."""

_STATE_FILE = "backend_state.pt"
_META_FILE = "backend.json"


class VerlBackend(Backend):
    """verl-based RL backend.

    Keyword arguments are :class:`agl_verl.config.VerlSettings` fields, for example
    ``VerlBackend(model_path="./model", adv_estimator="grpo", policy_loss="vanilla",
    clip_ratio=0.2, kl_coef=0.0, lr=1e-5, lora={"r": 8, "alpha": 16})``. Bad values
    raise :class:`agl.errors.ConfigError` naming the field.
    """

    def __init__(self, **config: Any):
        self.settings: VerlSettings = parse_settings(config)
        self.engine: Engine | None = None
        self._learner = None
        self._last_step: int | None = None

    # -- Backend --------------------------------------------------------------------------------

    @property
    def sampling_temperature(self) -> float:
        """``temperature``: the backend divides its logits by it and recomputes old log-probs at it."""
        return self.settings.temperature

    @property
    def group_baseline(self) -> bool:
        """Whether ``adv_estimator`` takes each task group's mean reward as its baseline (all but
        ``reinforce_plus_plus``, which whitens over the batch)."""
        return self.settings.adv_estimator not in BATCH_BASELINE_ESTIMATORS

    def setup(self, engine: Engine | None, context: BackendContext = STANDALONE) -> None:
        """Load the model and optimizer (local mode); remember ``engine`` to publish to, and ``context``."""
        self.engine = engine
        self.context = context
        if self.settings.mode == "distributed":
            return
        if self._learner is None:
            from agl_verl.local import LocalLearner

            self._learner = LocalLearner(self.settings, total_steps=context.total_steps)

    def train_step(self, transitions: list[Transition], step: int) -> dict[str, float]:
        """One update from ``transitions``; returns loss, pg_clipfrac, kl, entropy, grad_norm, ….

        Text-only transitions are skipped and counted (``skipped_text``), or raise
        with ``text_transitions="error"``. ``lr`` is the learning rate of this step's optimizer
        steps; the schedule is at training step ``step`` (earlier steps this backend never saw count).
        """
        if self.settings.mode == "distributed":
            raise AglError(
                "mode='distributed' runs verl's own trainer, which drives the steps itself; "
                "start it with VerlBackend.run_distributed() instead of train_step()"
            )
        learner = self._require_learner()
        learner.schedule_to(step)
        from agl_verl.dataproto import select_trainable, transitions_to_dataproto

        selection = select_trainable(transitions, on_text=self.settings.text_transitions)
        counts = {
            "transitions": float(len(selection.usable)),
            "skipped_text": float(selection.text_only),
            "skipped_empty": float(selection.empty_response),
        }
        if not selection.usable:
            return counts
        usable, correction = self._correction(selection.usable, counts)
        if not usable:
            return counts
        data = transitions_to_dataproto(
            usable,
            pad_token_id=learner.pad_token_id,
            max_prompt_length=self.settings.max_prompt_length,
            max_response_length=self.settings.max_response_length,
        )
        metrics = learner.update(data, correction)
        metrics.update(counts)
        metrics["truncated"] = float(data.meta_info["truncated"])
        self._last_step = step
        return metrics

    def _correction(self, transitions: list[Transition], counts: dict[str, float]):
        """The transitions to train on and the off-policy correction for them (see :mod:`agl_verl.correction`).

        A transition is off-policy when its model version is not the context's ``current_version``, or when
        its call asked for other sampling settings than the loss assumes (:meth:`sampled_unlike`);
        a correction needs behaviour log-probs, so transitions without them are left out and
        counted (``offpolicy_without_behaviour``).
        """
        from agl_verl import correction

        current = self.context.current_version
        unlike = [self.sampled_unlike(t) for t in transitions]
        behind = [current is not None and t.model_version != current for t in transitions]
        off = sum(a or b for a, b in zip(unlike, behind, strict=True))
        counts["offpolicy_transitions"] = float(off)
        counts["offpolicy_sampling"] = float(sum(unlike))
        chosen = correction.choose(self.settings.rollout_correction, off > 0)
        if chosen is None:
            return transitions, None
        usable = [t for t in transitions if t.behaviour_logprobs is not None]
        counts["offpolicy_without_behaviour"] = float(len(transitions) - len(usable))
        return usable, chosen

    def sampled_unlike(self, t: Transition) -> bool:
        """Whether ``t``'s call asked for other sampling settings than the loss assumes: ``temperature``
        (the backend's), top_p 1 and no top_k (a key the request left out is the engine's default:
        temperature 1, top_p 1, no top_k). A transition whose settings were not read counts as alike."""
        if t.sampling is None:
            return False
        asked = {"temperature": 1.0, "top_p": 1.0, **t.sampling}
        return (
            float(asked["temperature"]) != self.settings.temperature
            or float(asked["top_p"]) != 1.0
            or asked.get("top_k") not in (None, 0, -1)
        )

    def publish(self, step: int) -> ModelVersion:
        """Save the weights (or adapter) under ``workdir/versions/step-N`` (``<policy>-step-N`` for the
        context's named ``policy``) and have the engine serve them."""
        learner = self._require_learner()
        policy = self.context.policy
        name = f"step-{step}" if policy is None else f"{policy}-step-{step}"
        path = self.settings.versions_dir / name
        learner.save_weights(path)
        self._copy_tokenizer(path)
        lora = self.settings.lora is not None
        version = ModelVersion(
            version=name,
            path=str(path.resolve()),
            base_model=self.settings.model_path,
            step=step,
            policy=policy,
            metadata={"adapter": lora, "format": "peft" if lora else "transformers"},
        )
        if self.engine is not None:
            self.engine.load_version(version)
        return version

    def save_checkpoint(self, directory: Path) -> None:
        """Save weights, optimizer and learning-rate schedule state and RNG state so a resumed run continues
        identically."""
        import torch

        learner = self._require_learner()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(learner.state_dict(), directory / _STATE_FILE)
        meta = {"last_step": self._last_step, "settings": self.settings.model_dump(mode="json")}
        (directory / _META_FILE).write_text(json.dumps(meta, indent=1))

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what :meth:`save_checkpoint` saved."""
        import torch

        learner = self._require_learner()
        directory = Path(directory)
        state_file = directory / _STATE_FILE
        if not state_file.exists():
            raise FileNotFoundError(f"{state_file}: no verl backend checkpoint here")
        learner.load_state_dict(torch.load(state_file, weights_only=False))
        meta = json.loads((directory / _META_FILE).read_text())
        self._last_step = meta.get("last_step")

    def close(self) -> None:
        """Drop the model and optimizer."""
        self._learner = None

    # -- distributed -------------------------------------------------------------------------------

    def run_distributed(self, tasks_parquet: str | None = None) -> None:
        """Run verl's trainer on Ray (``mode="distributed"``; needs GPUs, see the README)."""
        if self.settings.mode != "distributed":
            raise AglError("run_distributed() needs mode='distributed'")
        from agl_verl.distributed import run_verl_trainer

        run_verl_trainer(self.settings, train_files=tasks_parquet)

    def train_distributed(self, trainer_config: Any, agent: Any, train: list, val: list) -> int:
        """``agl train`` in distributed mode: gateway, runner, data and verl's trainer (:mod:`agl_verl.launch`)."""
        if self.settings.mode != "distributed":
            raise AglError("train_distributed() needs mode='distributed'")
        from agl_verl.launch import train_distributed

        return train_distributed(trainer_config, agent, train, val)

    # -- helpers -----------------------------------------------------------------------------------

    @property
    def learner(self):
        """The :class:`agl_verl.local.LocalLearner` (after :meth:`setup`)."""
        return self._require_learner()

    def _require_learner(self):
        if self.settings.mode != "local":
            raise AglError(f"this needs mode='local'; the backend runs in mode={self.settings.mode!r}")
        if self._learner is None:
            raise AglError("call setup(engine) before training, publishing or checkpointing")
        return self._learner

    def _copy_tokenizer(self, target: Path) -> None:
        # The engine loads a version directory as a whole model, tokenizer included.
        source = Path(self.settings.model_path)
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.json",
            "merges.txt",
            "tokenizer.model",
            "chat_template.jinja",
            "generation_config.json",
        ):
            if (source / name).exists() and not (target / name).exists():
                shutil.copy2(source / name, target / name)
