"""examples.run_clock.RunClock: a seed's wall time over the processes that ran it."""

from __future__ import annotations

import json
import time

from examples.run_clock import RunClock


def test_a_fresh_run_counts_from_its_start_and_keeps_the_time_of_each_completed_step(tmp_path):
    clock = RunClock(tmp_path / "wall.json")
    assert clock.earlier_s == 0.0
    time.sleep(0.2)
    clock.agl_step_ended(step=1, metrics={})
    kept = json.loads((tmp_path / "wall.json").read_text())
    assert kept["step"] == 1 and 0.1 <= kept["wall_s"] <= clock.wall_s() + 0.05  # kept to a tenth of a second


def test_a_resumed_run_adds_its_earlier_processes_time(tmp_path):
    (tmp_path / "wall.json").write_text(json.dumps({"wall_s": 3600.0, "step": 7}))
    clock = RunClock(tmp_path / "wall.json")
    assert 3600.0 <= clock.wall_s() < 3600.0 + 60
    clock.agl_step_ended(step=8, metrics={})
    assert json.loads((tmp_path / "wall.json").read_text())["wall_s"] >= 3600.0
    assert not (tmp_path / "wall.tmp").exists()  # written through a rename, never half a file
