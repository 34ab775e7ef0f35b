"""A calc_agent seed killed in the middle of a step and resumed ends bit-identical to one never killed.

Both runs are ``python -m examples.calc_agent.train`` subprocesses of the same seed and options
(the tiny random model of :mod:`tests.examples.test_calc_agent` in place of SmolLM2, lockstep, a
validation curve). One runs to the end; the other is killed with SIGKILL (its process group: the
MCP calculator servers too) once ``trainer_state.json`` says step 1 is done and the store shows
step 2's rollouts started (some running, some perhaps ended), then started again with the same
command, which resumes its work directory and reruns step 2 whole. At the end the adapter's
weights are the same bytes, and the metrics of every step, the validation curve and the test
figures are the same.

The tiny model never solves a problem, so every reward would be 0, every advantage 0 and
every gradient 0: a resume that lost the optimizer's moments or the sampling state would
still end on the same weights. So the commands run ``train.py`` through :data:`DRIVER`, which
replaces the calculator's numeric match (and only it) by a deterministic function of the
reply's text that pays about half the replies: the groups have signal, the updates move the
adapter, and whatever a resume restores wrongly shows in the weights. (A stand-in for what
cannot happen here: a random model that sometimes answers right.)
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.examples.test_calc_agent import REPO, tiny_model

pytestmark = pytest.mark.slow

STEPS = 3
PROCESS_STATE = ("engine/prompt_tokens_cached", "engine/prompt_tokens_computed")
"""How the engine's prompt tokens split between its prefix cache and computation: the cache is the
process's memory, cold after a restart, so a resumed step computes what the uninterrupted run found
cached. Their sum, ``engine/prompt_tokens``, is compared."""


@pytest.fixture
def example():
    import examples.calc_agent.problems
    import examples.calc_agent.prompts

    return examples.calc_agent


DRIVER = """
import sys, zlib
import examples.calc_agent.rewards as rewards
rewards.numeric_match = lambda reply, answer: float(zlib.crc32(str(reply).encode()) % 2)
from examples.calc_agent.train import main
sys.exit(main(sys.argv[1:]))
"""
"""``train.py``'s command with the reward replaced by a deterministic coin on the reply's text (see above)."""


def command(model: Path, workdir: Path, results: Path, extra: tuple[str, ...] = ()) -> list[str]:
    argv = [sys.executable, "-c", DRIVER, "--seed", "0", "--steps", str(STEPS), *extra]
    argv += ["--batch-size", "2", "--n-rollouts", "2", "--eval-limit", "2", "--max-response-tokens", "8"]
    argv += ["--val-every", "1", "--val-limit", "2", "--threads", "1"]
    return argv + ["--model", str(model), "--workdir", str(workdir), "--results", str(results)]


def run(argv: list[str], log: Path) -> subprocess.Popen:
    """The command in its own process group (so a kill reaches the calculator servers it starts)."""
    out = log.open("ab")
    return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def completed_step(workdir: Path) -> int:
    state = workdir / "trainer_state.json"
    try:
        return json.loads(state.read_text())["completed_step"] if state.exists() else 0
    except ValueError:  # never half-written (an atomic rename), but be safe against a reader race
        return 0


def step_started(workdir: Path, step: int) -> bool:
    """Whether a runner has claimed any of ``step``'s rollouts (read-only, beside the running trainer)."""
    db = workdir / "agl.db"
    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            (n,) = conn.execute(
                "SELECT count(*) FROM rollouts WHERE rollout_id LIKE ? AND status != 'queued'", (f"%-s{step}-%",)
            ).fetchone()
    except sqlite3.OperationalError:  # the table not made yet, or the database locked a moment
        return False
    return n > 0


def untimed(record: dict) -> dict:
    """A metrics record without what measures time (seconds and rates: names ending ``_s``, which differ
    between any two runs) or the engine's cache state (:data:`PROCESS_STATE`)."""
    return {k: v for k, v in record.items() if not k.endswith("_s") and k not in PROCESS_STATE}


def metrics(workdir: Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [untimed(json.loads(line)) for line in lines if line.strip()]


def adapter_files(workdir: Path) -> dict[str, object]:
    """The last published adapter's files, by name: bytes, but ``adapter_config.json`` parsed, with its
    ``target_modules`` sorted (peft keeps them in a set, written in the order of the process's string hash)."""
    last = workdir / "verl" / "versions" / f"step-{STEPS}"
    files: dict[str, object] = {p.name: p.read_bytes() for p in sorted(last.iterdir()) if p.is_file()}
    assert "adapter_model.safetensors" in files, sorted(files)
    config = json.loads(files["adapter_config.json"])
    config["target_modules"] = sorted(config["target_modules"])
    files["adapter_config.json"] = config
    return files


@pytest.mark.parametrize("extra", [(), ("--filter-groups",)], ids=["lockstep", "filter-groups"])
def test_a_seed_killed_inside_a_step_resumes_to_the_same_bits(example, tmp_path, extra):
    """Lockstep, and with dynamic sampling (a step's later generation batches and its task position)."""
    model = tiny_model(example, tmp_path / "tiny")
    log = tmp_path / "runs.log"

    def tail() -> str:
        return log.read_text()[-3000:]

    whole = command(model, tmp_path / "whole", tmp_path / "whole-results", extra)
    assert run(whole, log).wait(timeout=900) == 0, tail()
    steps = [m for m in metrics(tmp_path / "whole") if m["kind"] == "train"]
    assert any(m["grad_norm"] > 0 for m in steps[1:]), steps  # steps after the first moved the adapter
    if extra:  # every step trained on batch-size groups with signal, some ran more than one batch for them
        assert all(m["filter_groups/groups_kept"] == 2 for m in steps), steps
        assert any(m["filter_groups/gen_batches"] > 1 for m in steps), steps

    killed = tmp_path / "killed"
    child = run(command(model, killed, tmp_path / "killed-results", extra), log)

    def second_step_running() -> bool:
        assert child.poll() is None, tail()
        return completed_step(killed) >= 1 and step_started(killed, 2)

    wait_until(second_step_running, "step 2's rollouts to start", 900, step_s=0.05, detail=tail)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert completed_step(killed) == 1  # killed inside step 2
    assert not (tmp_path / "killed-results").exists()
    earlier = json.loads((killed / "wall.json").read_text())  # the first process's time, to its step 1
    assert earlier["step"] == 1 and earlier["wall_s"] > 0

    resumed = time.monotonic()
    assert run(command(model, killed, tmp_path / "killed-results", extra), log).wait(timeout=900) == 0, tail()
    resumed_s = time.monotonic() - resumed
    assert "resuming run" in log.read_text()

    assert adapter_files(killed) == adapter_files(tmp_path / "whole")
    assert metrics(killed) == metrics(tmp_path / "whole")
    name = f"calc_agent{'-filter' if extra else ''}-steps{STEPS}-seed0.json"
    a = json.loads((tmp_path / "whole-results" / name).read_text())
    b = json.loads((tmp_path / "killed-results" / name).read_text())
    # the resumed seed's wall time counts its first process too (up to its last completed step)
    assert earlier["wall_s"] < b["wall_s"] <= earlier["wall_s"] + resumed_s
    for record in (a, b):  # what differs between any two runs: times, the run's id and its directory
        for key in ("wall_s", "step_s", "step_s_mean", "run_id", "workdir"):
            del record[key]
    assert b == a
