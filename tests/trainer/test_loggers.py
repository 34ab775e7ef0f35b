"""Experiment-tracker loggers on a real (short) training run: TensorBoard event files and an offline W&B run.

The run is the one of test_trainer.py: SqliteStore, the in-process gateway and runner,
tests/fake_engine.py as the model and TinyBackend as the backend. What is checked is
what a user reads back: the event files through TensorBoard's own EventAccumulator,
the W&B run through its transaction log (the ``.wandb`` file ``wandb sync`` uploads),
against the trainer's history (metrics.jsonl).
"""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path

import pytest

import agl
from agl.errors import ConfigError
from agl.plugins import register, unregister
from agl_trainer.cli import main
from agl_trainer.config import parse_config
from agl_trainer.loggers import Logger, TensorBoardLogger, WandbLogger, build_loggers, metric_name, scalars
from agl_trainer.trainer import Trainer
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, _tasks, agent, small_config


@pytest.fixture
def engine():
    with FakeEngine() as eng:
        yield eng


def read_tensorboard(logdir: Path):
    """Every scalar as {tag: {step: value}}, and the accumulator (TensorBoard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}, acc


def read_wandb(run_dir: Path) -> list:
    """The records of an offline W&B run's ``.wandb`` file (a LevelDB-style log of ``Record`` protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, partial, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(partial + payload)
            records.append(record)
            partial = b""
        else:
            partial += payload
    return records


def wandb_history(records) -> dict[int, dict[str, float]]:
    out = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            out[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


def _same(a: float, b: float, rel: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=1e-12)


def test_tensorboard_and_wandb_hold_every_step_metric_of_the_history(tmp_path, engine):
    config = small_config(
        tmp_path,
        engine,
        steps=3,
        val_every=2,
        rollout={"concurrency": 4, "heartbeat_s": 0.2, "resources": {"api_key": "resource-secret"}},
        loggers=["tensorboard", {"name": "wandb", "project": "agl-test", "system_metrics": False}],
    )
    trainer = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl"))
    result = trainer.fit(agent, _tasks(4), _tasks(2, prefix="v"))
    assert result.steps_completed == 3
    history = result.history
    # the final validation is logged at the last training step
    assert [(r["kind"], r["step"]) for r in history] == [("val", 0), *[("train", s) for s in (1, 2, 3)], ("val", 3)]
    assert not any(lg.failed for lg in trainer.loggers)

    # TensorBoard: every numeric value of every record, at its step (float32 in the file)
    tb, acc = read_tensorboard(tmp_path / "run" / "tensorboard")
    expected: dict[str, dict[int, float]] = {}
    for record in history:
        for tag, value in scalars(record).items():
            expected.setdefault(tag, {})[record["step"]] = value
    assert set(tb) == set(expected)
    for tag, steps in expected.items():
        assert set(tb[tag]) == set(steps), tag
        for step, value in steps.items():
            assert _same(tb[tag][step], value, rel=1e-6), (tag, step, tb[tag][step], value)
    assert set(tb["val/reward_mean"]) == {0, 2, 3}  # before, val_every=2, after (at the last step)
    assert set(tb["train/reward_mean"]) == set(tb["train/loss"]) == {1, 2, 3}
    assert tb["train/loss"][2] == pytest.approx(0.5)  # TinyBackend's 1/step
    for tag in ("train/tokens_per_s", "train/success_rate", "time/rollout_s", "time/step_s", "time/val_s"):
        assert tag in tb, tag
    assert "train/model_version" not in tb and "train/kind" not in tb
    (config_event,) = acc.Tensors("config")
    text = config_event.tensor_proto.string_val[0].decode()
    run_id = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["run_id"]
    assert run_id in text and '"val_every": 2' in text
    assert "resource-secret" not in text and '"api_key": "***"' in text
    from tensorboard.plugins.hparams import metadata

    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    hparams = metadata.parse_session_start_info_plugin_data(content).hparams
    assert hparams["steps"].number_value == 3 and hparams["rollout.concurrency"].number_value == 4
    assert hparams["plot"].bool_value is False and hparams["rollout.resources.api_key"].string_value == "***"
    assert hparams["engine_urls"].string_value == json.dumps([engine.url])

    # W&B (offline): the same values, at the same steps, in the run's transaction log
    wandb_logger = next(lg for lg in trainer.loggers if lg.name == "wandb")
    run_dir = next((tmp_path / "run" / "wandb").glob("offline-run-*"))
    records = read_wandb(run_dir)
    wb = wandb_history(records)
    assert sorted(wb) == [0, 1, 2, 3]
    for record in history:
        logged = wb[record["step"]]
        want = scalars(record)
        at_step = {k for r in history if r["step"] == record["step"] for k in scalars(r)}
        assert set(logged) == at_step, record["step"]  # step 3: the last training step's and the final validation's
        for key, value in want.items():
            assert _same(logged[key], value, rel=1e-12), (key, logged[key], value)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == run_id and run.display_name == run_id and run.project == "agl-test"
    wb_config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert wb_config["agl_run_id"] == run_id and wb_config["steps"] == 3
    assert wb_config["rollout"]["resources"]["api_key"] == "***"
    assert wandb_logger.run_dir is None  # closed by the trainer


class _DiskFull(TensorBoardLogger):
    """The TensorBoard logger on a disk that fills up after step 1 (writes from step 2 on raise ENOSPC)."""

    writes = 0

    def write(self, step, values):
        type(self).writes += 1
        if step >= 2:
            raise OSError(28, "No space left on device")
        super().write(step, values)


class _StepCounter:
    def __init__(self):
        self.steps = []

    @agl.hookimpl
    def agl_step_ended(self, step, metrics):
        self.steps.append(step)


class _DiskFullPlugin:
    """Registers :class:`_DiskFull` as ``tensorboard``, in place of the built-in one (which registers trylast)."""

    @agl.hookimpl
    def agl_register_loggers(self, register):
        register("tensorboard", _DiskFull)


def test_a_failing_logger_warns_once_and_training_completes(tmp_path, engine, monkeypatch, caplog):
    monkeypatch.setattr(_DiskFull, "writes", 0)
    counter = _StepCounter()
    register(counter, name="test-loggers-counter")
    register(_DiskFullPlugin(), name="test-loggers-disk-full")
    config = small_config(tmp_path, engine, steps=3, loggers=["tensorboard"])
    try:
        with caplog.at_level(logging.WARNING, logger="agl_trainer.loggers"):
            trainer = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl"))
            result = trainer.fit(agent, _tasks(2))
    finally:
        unregister(name="test-loggers-counter")
        unregister(name="test-loggers-disk-full")
    assert result.steps_completed == 3 and counter.steps == [1, 2, 3]  # training and the other plugins go on
    warnings = [r.getMessage() for r in caplog.records if r.name == "agl_trainer.loggers"]
    assert len(warnings) == 1, warnings
    assert "'tensorboard' failed at step 2" in warnings[0] and "No space left on device" in warnings[0]
    assert _DiskFull.writes == 2  # switched off after its failure: step 3 was not tried
    (logger,) = trainer.loggers
    assert isinstance(logger.failed, OSError)
    tb, _ = read_tensorboard(tmp_path / "run" / "tensorboard")
    assert set(tb["train/reward_mean"]) == {1}  # what was written before the failure is there
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]


def test_a_logger_that_cannot_open_warns_once_and_training_completes(tmp_path, engine, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the event files' directory should be")
    config = small_config(tmp_path, engine, steps=2, loggers=[{"name": "tensorboard", "dir": str(blocker)}])
    with caplog.at_level(logging.WARNING, logger="agl_trainer.loggers"):
        result = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, _tasks(2))
    assert result.steps_completed == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "agl_trainer.loggers"]
    assert len(warnings) == 1 and "'tensorboard' failed at start" in warnings[0], warnings
    assert blocker.read_text().startswith("a file")


@pytest.mark.parametrize(
    ("loggers", "message"),
    [
        (["tensorbord"], "loggers.0: logger: no plugin provides 'tensorbord' (did you mean 'tensorboard'?"),
        (["tensorboard", "mlflow"], "loggers.1: logger: no plugin provides 'mlflow' (installed: tensorboard, wandb;"),
        ([{"name": "wandb", "projct": "x"}], "loggers.0: logger 'wandb': option 'projct': Extra inputs"),
        ([{"name": "wandb", "mode": "cloud"}], "loggers.0: logger 'wandb': option 'mode': Input should be"),
        (["wandb", {"name": "wandb"}], "loggers: 'wandb' given more than once"),
        ("tensorboard", "loggers: Input should be a valid list"),
    ],
)
def test_bad_loggers_are_config_errors_naming_the_field(loggers, message):
    with pytest.raises(ConfigError) as err:
        Trainer({"loggers": loggers})
    assert message in str(err.value)


def test_agl_train_logger_flag_checks_the_name(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"input": {"word": "a"}}) + "\n")
    code = main(["train", "tests.trainer.test_trainer:agent", "--tasks", str(tasks), "--logger", "tensorbord"])
    assert code == 2
    assert "no plugin provides 'tensorbord' (did you mean 'tensorboard'?" in capsys.readouterr().err


def test_a_missing_library_names_the_extra_to_install(monkeypatch):
    monkeypatch.setattr(WandbLogger, "package", "agl_test_no_such_package")
    config = parse_config({"loggers": ["tensorboard", "wandb"]})
    with pytest.raises(ConfigError) as err:
        build_loggers(config.loggers)
    assert "loggers[1]: the 'wandb' logger needs the agl_test_no_such_package package" in str(err.value)
    assert "pip install 'agl-trainer[wandb]'" in str(err.value)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("reward_mean", "train/reward_mean"),
        ("val_success_rate", "val/success_rate"),
        ("time_rollout_s", "time/rollout_s"),
        ("build_rollouts_skipped", "build/rollouts_skipped"),
        ("actor/pg_loss", "actor/pg_loss"),
        ("validation", "train/validation"),
    ],
)
def test_metric_names_group_like_the_trackers_sections(key, name):
    assert metric_name(key) == name


def test_a_resumed_run_continues_the_same_curves(tmp_path, engine):
    loggers = ["tensorboard", {"name": "wandb", "system_metrics": False}]
    for steps in (2, 3):  # a run of 2 steps, then resumed for a third
        config = small_config(tmp_path, engine, steps=steps, loggers=loggers)
        result = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, _tasks(2))
    assert [r["step"] for r in result.history] == [1, 2, 3]
    run_id = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["run_id"]

    tensorboard = tmp_path / "run" / "tensorboard"
    assert len(list(tensorboard.glob("events.out.tfevents.*"))) == 2  # one file per process
    tb, _ = read_tensorboard(tensorboard)
    for record in result.history:
        for tag, value in scalars(record).items():
            assert _same(tb[tag][record["step"]], value, rel=1e-6), (tag, record["step"])
    assert set(tb["train/reward_mean"]) == {1, 2, 3}

    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    logged = [read_wandb(run_dir) for run_dir in runs]
    assert {r.run.run_id for records in logged for r in records if r.WhichOneof("record_type") == "run"} == {run_id}
    assert [sorted(wandb_history(records)) for records in logged] == [[1, 2], [3]]


def test_agl_train_logger_flags_add_to_the_config_files_loggers(tmp_path):
    import argparse

    from agl_trainer.cli.train import build_config, register

    (tmp_path / "train.yaml").write_text("loggers: [{name: wandb, project: from-file}]\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["train", "--config", str(tmp_path / "train.yaml"), "--logger", "tensorboard", "--logger", "wandb"]
    )
    loggers = [entry.model_dump() for entry in build_config(args).loggers]
    assert loggers == [{"name": "wandb", "project": "from-file"}, {"name": "tensorboard"}]


class _BrokenBackend(TinyBackend):
    def train_step(self, transitions, step):
        if step == 2:
            raise RuntimeError("the backend broke at step 2")
        return super().train_step(transitions, step)


def test_a_run_that_fails_closes_its_loggers_and_wandb_marks_it_failed(tmp_path, engine):
    from agl.plugins import get_plugin_manager

    loggers = ["tensorboard", {"name": "wandb", "system_metrics": False}]
    config = small_config(tmp_path, engine, steps=3, loggers=loggers)
    trainer = Trainer(config, backend=_BrokenBackend(tmp_path / "calls.jsonl"))
    with pytest.raises(RuntimeError, match="broke at step 2"):
        trainer.fit(agent, _tasks(2))
    # the run's loggers (agl_trainer.loggers.<name>:<id>) are gone; the built-in plugin that registers them stays
    assert not [name for name, _ in get_plugin_manager().list_name_plugin() if name.startswith("agl_trainer.loggers.")]
    tb, _ = read_tensorboard(tmp_path / "run" / "tensorboard")
    assert set(tb["train/reward_mean"]) == {1}
    (run_dir,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    records = read_wandb(run_dir)
    assert sorted(wandb_history(records)) == [1]
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 1


def test_the_logged_config_hides_secrets_and_keeps_the_rest():
    from agl_trainer.loggers import redacted

    config = {
        "store": "postgresql://agl:hunter2@db.local:5432/agl",
        "gateway": {"token": "t0ken", "url": None, "port": 0},
        "backend": {"config": {"tokenizer_path": "./model", "hf_token": "hf_x", "api_key": "sk-x", "lr": 1e-6}},
        "rollout": {"max_response_tokens": 64, "resources": {"client-secret": "s", "keys": ["a", "b"]}},
    }
    assert redacted(config) == {
        "store": "postgresql://agl:***@db.local:5432/agl",
        "gateway": {"token": "***", "url": None, "port": 0},
        "backend": {"config": {"tokenizer_path": "./model", "hf_token": "***", "api_key": "***", "lr": 1e-6}},
        "rollout": {"max_response_tokens": 64, "resources": {"client-secret": "***", "keys": ["a", "b"]}},
    }


class _ListLogger(Logger):
    """A plugin's logger that needs no library: it keeps what it is sent in a list."""

    name = "in-memory"

    def open(self, run) -> None:
        self.seen: list[tuple[int, dict[str, float]]] = []

    def write(self, step, values):
        self.seen.append((step, dict(values)))


class _ListLoggerPlugin:
    @agl.hookimpl
    def agl_register_loggers(self, register):
        register("in-memory", _ListLogger)


def test_a_plugin_logger_that_names_no_package_is_built():
    register(_ListLoggerPlugin(), name="test-loggers-in-memory")
    try:
        (logger,) = build_loggers(["in-memory"])
    finally:
        unregister(name="test-loggers-in-memory")
    assert isinstance(logger, _ListLogger)
    assert _ListLogger.install_hint() == ""
