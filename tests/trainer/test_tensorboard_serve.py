"""``tensorboard --logdir <workdir>/tensorboard`` serves what a run wrote: the extra installs a
TensorBoard that starts (tensorboard 2.20 and older import ``pkg_resources``, which setuptools 81
removed; see trainer/pyproject.toml's ``tensorboard`` extra).

The real ``tensorboard`` command of this environment, on loopback, on a short real run's event
files; ``train/reward_mean`` is read back through TensorBoard's own HTTP API.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from agl_trainer.trainer import Trainer
from tests.conftest import stop_process, wait_until
from tests.fake_engine import FakeEngine
from tests.trainer.test_trainer import TinyBackend, _tasks, agent, small_config

SERVING = re.compile(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+/)")


def tensorboard_command() -> list[str]:
    """The ``tensorboard`` script of the Python running the tests (what the extra installs)."""
    script = Path(sys.executable).parent / "tensorboard"
    assert script.exists(), f"{script}: no tensorboard command (pip install 'agl-trainer[tensorboard]')"
    return [str(script)]


def served_scalars(
    command: Sequence[str], logdir: Path, tag: str, steps: int, timeout_s: float = 60.0
) -> dict[int, float]:
    """Start ``command --logdir logdir`` on a free loopback port, read ``tag``'s scalars of the run
    ``.`` through ``/data/plugin/scalars/scalars`` until ``steps`` steps are there, stop it;
    ``{step: value}``."""
    proc = subprocess.Popen(
        [*command, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", "0", "--load_fast", "false"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    got: dict[int, float] = {}

    def url() -> str | None:
        if proc.poll() is not None:
            pytest.fail(f"tensorboard exited {proc.returncode} before serving:\n{''.join(lines)}")
        found = SERVING.search("".join(lines))
        return found.group(1) if found else None

    def scalars_read() -> bool:
        r = httpx.get(f"{url()}data/plugin/scalars/scalars", params={"run": ".", "tag": tag}, timeout=5)
        if r.status_code == 200:
            got.update({int(step): value for _wall, step, value in r.json()})
        return len(got) >= steps

    try:
        wait_until(url, "tensorboard says where it serves", timeout_s, step_s=0.1, detail=lambda: "".join(lines))
        wait_until(scalars_read, f"tensorboard serves {tag}", timeout_s, step_s=0.2, detail=lambda: "".join(lines))
    finally:
        stop_process(proc)
    return got


@pytest.mark.timeout(180)
def test_tensorboard_serves_train_reward_mean_of_a_run(tmp_path):
    with FakeEngine() as engine:
        config = small_config(tmp_path, engine, steps=2, loggers=["tensorboard"])
        result = Trainer(config, backend=TinyBackend(tmp_path / "calls.jsonl")).fit(agent, _tasks(4))
    assert result.steps_completed == 2
    want = {r["step"]: r["reward_mean"] for r in result.history if r["kind"] == "train"}

    served = served_scalars(tensorboard_command(), tmp_path / "run" / "tensorboard", "train/reward_mean", steps=2)

    assert set(served) == {1, 2}
    for step, value in want.items():
        assert served[step] == pytest.approx(value, rel=1e-6)  # float32 in the event file
