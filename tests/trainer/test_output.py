"""What a training run prints and draws: lines that fit, numbers that read, one backend left alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agl.errors import ConfigError
from agl_trainer import Trainer
from agl_trainer.metrics import before_after, console_line, plot_reward_curve
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, _tasks, agent, small_config

RECORD = {
    "step": 3,
    "reward_mean": 0.41,
    "reward_std": 0.12,
    "success_rate": 0.375,
    "loss": -3.2e-6,
    "kl": 0.0,
    "entropy": 1.234,
    "transitions": 64.0,
    "response_length_mean": 12.5,
    "tokens_per_s": 812.4,
    "time_rollout_s": 12.3,
    "time_update_s": 4.5,
}


def test_a_step_line_reads_small_losses_and_whole_counts():
    line = console_line(RECORD, 20)
    assert line.startswith("step 3/20  reward 0.410±0.120  success 38%")
    assert "loss -3.20e-06" in line and "kl 0 " in line and "-0.0000" not in line
    assert "trans 64 " in line and "tok/s 812 " in line and "(rollout 12.3s, update 4.5s)" in line


def test_a_filtered_steps_line_says_how_many_batches_it_ran_and_groups_it_dropped():
    line = console_line({**RECORD, "filter_groups/gen_batches": 3.0, "filter_groups/groups_dropped": 4.0}, 20)
    assert "batches 3  dropped 4  (rollout" in line
    assert "batches" not in console_line(RECORD, 20)  # a step without filtering says nothing of it


def test_a_step_line_fits_the_width_dropping_the_least_telling_fields_first():
    full = console_line(RECORD, 20)
    narrow = console_line(RECORD, 20, width=70)
    assert len(narrow) <= 70 < len(full) and full.startswith(narrow)
    assert "rollout 12.3s" not in narrow and "loss" in narrow
    assert console_line(RECORD, 20, width=10).startswith("step 3/20  reward 0.410±0.120  success 38%")


def test_before_after_shows_counts_as_whole_numbers():
    rows = dict(
        (label, (b, a, c))
        for label, b, a, c in before_after(
            {"val_reward_mean": 0.25, "val_rollouts": 200.0, "val_rollouts_failed": 3.0},
            {"val_reward_mean": 0.5, "val_rollouts": 200.0, "val_rollouts_failed": 1.0},
        )
    )
    assert rows["reward (mean)"] == ("0.250", "0.500", "+0.250")
    assert rows["rollouts"] == ("200", "200", "+0") and rows["failed"] == ("3", "1", "-2")


def test_the_reward_curve_leaves_the_plotting_backend_alone_and_clips_its_band(tmp_path):
    code = f"""
import json, matplotlib
matplotlib.use("svg")
from agl_trainer.metrics import plot_reward_curve
records = [{{"kind": "train", "step": s, "reward_mean": m, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 1.0}}
           for s, m in [(1, 0.1), (2, 0.9)]]
path = plot_reward_curve(records, {str(tmp_path / "curve.png")!r})
print(json.dumps({{"backend": matplotlib.get_backend(), "size": path.stat().st_size}}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["backend"] == "svg" and out["size"] > 1000


def test_the_band_stays_within_the_rewards_seen(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    bands = []
    original = Axes.fill_between
    monkeypatch.setattr(
        Axes, "fill_between", lambda self, x, lo, hi, **kw: bands.append((lo, hi)) or original(self, x, lo, hi, **kw)
    )
    records = [
        {"kind": "train", "step": s, "reward_mean": m, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 1.0}
        for s, m in [(1, 0.1), (2, 0.9)]
    ]
    plot_reward_curve(records, tmp_path / "curve.png")
    [(lo, hi)] = bands
    assert lo == [0.0, 0.4] and hi == [0.6, 1.0]


def test_importing_the_verl_backend_is_quiet_and_leaves_logging_alone():
    code = (
        "import logging, warnings\n"
        "warnings.simplefilter('always')\n"
        "import agl_verl.backend, agl_verl.local\n"
        "print(len(logging.getLogger().handlers))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "0"  # verl's logging.basicConfig did not stay
    assert "engine is not available" not in proc.stderr and "accelerator" not in proc.stderr, proc.stderr


@pytest.fixture
def engine():
    with FakeEngine() as eng:
        yield eng


def test_a_workdir_resumes_only_the_run_it_holds(tmp_path, engine, capsys):
    Trainer(small_config(tmp_path, engine), backend=TinyBackend(tmp_path / "a.jsonl")).fit(agent, _tasks(2))
    with pytest.raises(ConfigError) as err:
        Trainer(
            small_config(tmp_path, engine, batch_size=4, **{"rollout.concurrency": 2}),
            backend=TinyBackend(tmp_path / "c.jsonl"),
        ).fit(agent, _tasks(2))
    message = str(err.value)
    assert "batch_size: 2 → 4" in message and "rollout.concurrency: 4 → 2" in message and "workdir" in message
    # more steps extend the same run: a resume, said on the console
    result = Trainer(small_config(tmp_path, engine, steps=2), backend=TinyBackend(tmp_path / "b.jsonl")).fit(
        agent, _tasks(2)
    )
    assert result.steps_completed == 2 and "agl: resuming run" in capsys.readouterr().err


def quiet_agent(task_input, ctx):
    """One model call, no reward of its own: the reward comes from a plugin."""
    import httpx

    headers = {"Authorization": f"Bearer {ctx.api_key}"}
    body = {"model": ctx.model, "messages": [{"role": "user", "content": task_input["word"]}]}
    httpx.post(f"{ctx.base_url}/chat/completions", json=body, headers=headers, timeout=30).raise_for_status()


def test_plugins_named_in_the_config_are_registered_before_training(tmp_path, engine):
    from agl.plugins import get_plugin_manager, unregister

    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(
        "import agl\n\n@agl.hookimpl\ndef agl_reward(rollout, spans, llm_calls, rewards):\n    return 0.25\n"
    )
    config = small_config(tmp_path, engine, plugins=[str(reward_file)])
    try:
        result = Trainer(config, backend=TinyBackend(tmp_path / "a.jsonl")).fit(quiet_agent, _tasks(2))
        assert get_plugin_manager().get_plugin(str(reward_file)) is not None
    finally:
        unregister(name=str(reward_file))
    assert [r["reward_mean"] for r in result.history if r["kind"] == "train"] == [0.25]
    with pytest.raises(ConfigError, match=r"plugins\[0\]: file 'nope.py' does not exist"):
        Trainer(small_config(tmp_path / "b", engine, plugins=["nope.py"])).fit(quiet_agent, _tasks(2))
