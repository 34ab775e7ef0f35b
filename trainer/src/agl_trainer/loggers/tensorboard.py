"""TensorBoard event files in the run's workdir: ``tensorboard --logdir <workdir>/tensorboard``.

The events are written with the ``tensorboard`` package's own writer
(``tensorboard.summary.writer.event_file_writer.EventFileWriter``) and protobufs
(``tensorboard.compat.proto``), the same writer ``torch.utils.tensorboard`` uses
underneath. Why that and not torch's ``SummaryWriter`` or ``tensorboardX``: the
package that writes is then the package that reads and serves the files, so there
is one dependency (``agl-trainer[tensorboard]`` installs just ``tensorboard``),
neither torch nor TensorFlow is imported, and a run on a machine without torch
(external runners, a remote backend) logs the same way.

What goes in: every numeric value of each step record as a scalar, named by
:func:`~agl_trainer.loggers.base.metric_name` (``train/reward_mean``,
``val/success_rate``, ``time/rollout_s``, …) at the step's number, and the
config once: as the text summary ``config`` (the whole of it, in the Text tab) and
as the run's hyperparameters (its leaves, dotted: ``rollout.concurrency``, in the
HParams tab, to compare runs side by side). A resumed run opens a new event
file that starts with a session-start event at its first step, so TensorBoard
drops what the interrupted process had logged for the step it did not finish.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from agl_trainer.loggers.base import Logger, LoggerOptions, RunInfo


class TensorBoardOptions(LoggerOptions):
    """Options of the ``tensorboard`` logger."""

    dir: str | None = Field(default=None, description="where the event files go (default: <workdir>/tensorboard)")


class TensorBoardLogger(Logger):
    """Writes TensorBoard event files (see the module docstring)."""

    name = "tensorboard"
    options_model = TensorBoardOptions
    package = "tensorboard"
    extra = "tensorboard"
    options: TensorBoardOptions
    logdir: Path | None = None
    """Where the event files go, once open."""
    _writer: Any = None

    def open(self, run: RunInfo) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = Path(self.options.dir) if self.options.dir else run.workdir / "tensorboard"
        self._writer = EventFileWriter(str(self.logdir), flush_secs=5)
        start = SessionLog(status=SessionLog.START, msg=f"agl {run.run_id} from step {run.first_step}")
        self._writer.add_event(Event(wall_time=time.time(), step=run.first_step, session_log=start))
        self._writer.add_event(self._text_event("config", _config_markdown(run), run.first_step))
        self._writer.add_event(self._hparams_event(run))
        self._writer.flush()

    def write(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()  # a step takes seconds at least: let a live TensorBoard see it now

    def close(self, failed: bool = False) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    @staticmethod
    def _text_event(tag: str, text: str, step: int) -> Any:
        """A text-plugin summary (a string tensor), which TensorBoard's Text tab renders as Markdown."""
        from tensorboard.compat.proto import types_pb2
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(
            dtype=types_pb2.DT_STRING,
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        summary = Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
        return Event(wall_time=time.time(), step=step, summary=summary)

    @staticmethod
    def _hparams_event(run: RunInfo) -> Any:
        """The HParams plugin's session-start summary: the config's leaves as the run's hyperparameters."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import metadata, plugin_data_pb2

        info = plugin_data_pb2.SessionStartInfo(group_name=run.run_id, start_time_secs=time.time())
        for key, value in flatten(run.config).items():
            if isinstance(value, bool):
                info.hparams[key].bool_value = value
            elif isinstance(value, int | float):
                info.hparams[key].number_value = value
            else:
                info.hparams[key].string_value = value if isinstance(value, str) else json.dumps(value)
        content = plugin_data_pb2.HParamsPluginData(session_start_info=info)
        value = Summary.Value(tag=metadata.SESSION_START_INFO_TAG, metadata=metadata.create_summary_metadata(content))
        return Event(wall_time=time.time(), step=run.first_step, summary=Summary(value=[value]))


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config's leaves under dotted keys (``{"rollout": {"concurrency": 4}}`` → ``rollout.concurrency``).

    Lists and empty mappings are leaves; None values are left out.
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = value
    return out


def _config_markdown(run: RunInfo) -> str:
    """The run id and the config as a Markdown code block."""
    body = json.dumps(run.config, indent=2, sort_keys=True, default=str)
    return f"agl run `{run.run_id}`\n\n" + "\n".join("    " + line for line in body.splitlines())


__all__ = ["TensorBoardLogger", "TensorBoardOptions"]
