"""agl_verl's OpenMP wait policy (agl_verl.threads), in real subprocesses: libgomp reads it once, when torch loads.

Each test starts a fresh interpreter, so that which of agl_verl and torch comes first is
what the test says. Most read the environment libgomp's getenv sees when torch loads
(``os.environ``, which putenv keeps in step); one measures what libgomp did with it: the
CPU its idle workers burn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPORT = (
    "import json, os, sys, warnings\n"
    "warnings.simplefilter('always')\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    {imports}\n"
    "print(json.dumps({{'policy': os.environ.get('OMP_WAIT_POLICY'), 'spin': os.environ.get('GOMP_SPINCOUNT'),"
    " 'torch': 'torch' in sys.modules, 'warnings': [f'{{w.category.__name__}}: {{w.message}}' for w in caught]}}))\n"
)


def run(imports: str, **env: str) -> dict:
    """What a fresh interpreter that runs ``imports`` (one line) reports, with ``env`` on top of a clean policy."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", REPORT.format(imports=imports)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_agl_verl_before_torch_sets_the_passive_policy_without_a_warning():
    seen = run("import agl_verl; import torch")
    assert seen == {"policy": "PASSIVE", "spin": None, "torch": True, "warnings": []}


SPIN_PROBE = (
    "{first}\n"
    "import os, time\n"
    "torch.set_num_threads(2)\n"
    "a, b = torch.ones(2_000_000), torch.ones(2_000_000)\n"
    "c = a + b\n"
    "cpu, wall = time.process_time(), time.perf_counter()\n"
    "for _ in range(150):\n"
    "    torch.add(a, b, out=c)\n"
    "    time.sleep(0.003)\n"
    "print(time.process_time() - cpu)\n"
)


def idle_worker_cpu(first: str) -> float:
    """CPU seconds of a process that runs 150 small two-thread additions with 3 ms sleeps between them."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = SPIN_PROBE.format(first=first)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip().splitlines()[-1])


def test_libgomp_gets_the_policy_its_idle_workers_sleep_instead_of_spinning():
    # With libgomp's default the worker spins through most of each 3 ms sleep (about 0.3 s of CPU
    # over 150 sleeps); with the policy agl_verl sets it sleeps at once.
    spinning = idle_worker_cpu("import torch; import agl_verl")
    passive = idle_worker_cpu("import agl_verl; import torch")
    assert passive < 0.5 * spinning, (passive, spinning)


@pytest.mark.parametrize(
    ("name", "value"),
    [("OMP_WAIT_POLICY", "active"), ("OMP_WAIT_POLICY", "passive"), ("GOMP_SPINCOUNT", "10000")],
)
def test_a_users_own_setting_is_kept(name, value):
    seen = run("import agl_verl; import torch", **{name: value})
    assert seen["warnings"] == []
    if name == "OMP_WAIT_POLICY":
        assert seen["policy"] == value and seen["spin"] is None
    else:
        assert seen["policy"] is None and seen["spin"] == value


def test_torch_first_leaves_the_policy_unset_and_warns_naming_the_variable_and_the_fix():
    seen = run("import torch; import agl_verl")
    assert seen["policy"] is None
    [warning] = [w for w in seen["warnings"] if w.startswith("ThreadPolicyWarning")]
    assert "OMP_WAIT_POLICY=passive" in warning
    assert "Import agl_verl before torch" in warning


def test_torch_first_with_the_users_own_policy_does_not_warn():
    seen = run("import torch; import agl_verl", OMP_WAIT_POLICY="passive")
    assert seen["policy"] == "passive"
    assert seen["warnings"] == []


def test_agl_verl_alone_does_not_import_torch():
    assert run("import agl_verl")["torch"] is False


@pytest.mark.parametrize("entry", ["examples.calc_agent.train", "examples.first_digit.train"])
def test_the_examples_set_the_policy_before_they_import_torch(entry):
    seen = run(f"import {entry}; import torch")
    assert seen["policy"] == "PASSIVE"
    assert not [w for w in seen["warnings"] if w.startswith("ThreadPolicyWarning")]


def test_the_agl_command_loads_agl_verl_before_it_runs_a_command():
    code = (
        "import os, sys\n"
        "from agl_trainer.cli import build_parser\n"
        "build_parser()\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["PASSIVE", "False"]


def test_set_torch_threads_sets_the_count_and_refuses_less_than_one():
    code = (
        "import agl_verl.threads as t\n"
        "print(t.set_torch_threads(1), t.set_torch_threads(None))\n"
        "try:\n    t.set_torch_threads(0, what='--threads')\n"
        "except ValueError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1 1", "--threads: must be at least 1, got 0"]
