"""``agl run`` writes a rollout's resources to files whatever characters its id holds.

The resources folder's name is derived from the rollout id; an id holding ``/`` (or any
character a file name cannot) used to name a folder that does not exist, and ``agl run``
crashed before the child ran, leaving the rollout "running" until its heartbeat timed out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agl.schema import Rollout, RolloutStatus, Task
from agl.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parents[2]
AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]


@pytest.mark.parametrize("rollout_id", ["task/7/ro-1", "../ro:2 \\x", "ro-" + "é" * 50])
def test_a_rollout_id_with_slashes_gets_its_resources_as_files(tmp_path, rollout_id):
    program = tmp_path / "agent.py"
    program.write_text(
        "import json, os, sys\n"
        "folder = os.environ['AGL_RESOURCES_DIR']\n"
        "json.dump({'prompt': open(os.path.join(folder, 'system_prompt.txt')).read(), 'folder': folder},"
        " open(sys.argv[1], 'w'))\n"
    )
    db = tmp_path / "agl.db"
    with SqliteStore(db) as store:
        store.add_tasks([Task(task_id="t", input={})])
        store.enqueue([Rollout(rollout_id=rollout_id, task_id="t", resources={"system_prompt": "Be exact."})])
    out = tmp_path / "seen.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [*AGL, "run", "--store", f"sqlite:///{db}", "--", sys.executable, str(program), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["prompt"] == "Be exact."
    assert Path(seen["folder"]).name.startswith("agl-resources-") and not os.path.exists(seen["folder"])
    with SqliteStore(db) as store:
        assert store.get_rollout(rollout_id).status == RolloutStatus.SUCCEEDED
