"""The stack the end-to-end agents run against: SmolLM2-135M-Instruct behind the agl gateway.

One transformers engine and one gateway per session (the model loads once); each
agent runs as ``agl run -- python tests/e2e/agents/<agent>.py`` in a subprocess, as one
rollout, with nothing but environment variables pointing it at the gateway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

AGENTS = Path(__file__).parent / "agents"
ROOT = Path(__file__).parents[2]
TOKEN = "e2e-token"


@dataclass
class AgentRun:
    rollout_id: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> dict:
        """The JSON line the agent printed last."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        assert lines, f"the agent printed no result\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-3000:]}"
        return json.loads(lines[-1])


class Stack:
    def __init__(self, store, gateway, store_url: str, tokenizer, engine):
        self.store = store
        self.gateway = gateway
        self.engine = engine
        self.store_url = store_url
        self.tokenizer = tokenizer
        self._n = 0

    def run_agent(self, script: str, switch: dict[str, str], timeout: float = 240) -> AgentRun:
        """``agl run -- python agents/<script>`` as one claimed rollout, with ``switch`` in the environment."""
        from agl.schema import Rollout, Task

        self._n += 1
        rid = f"ro-e2e-{self._n}-{Path(script).stem}"
        self.store.add_tasks([Task(task_id=f"task-{rid}", input={"script": script})])
        self.store.enqueue([Rollout(rollout_id=rid, task_id=f"task-{rid}")])
        (claimed,) = self.store.claim("e2e-runner", limit=1)
        assert claimed.rollout_id == rid
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "AGL_")) and k not in ("PYTEST_CURRENT_TEST",)
        }
        env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **switch})
        env["AGL_ROLLOUT_KEY"] = self.gateway.rollout_key(rid, claimed.attempt)  # as a runner hands it on
        agl = str(Path(sys.executable).parent / "agl")
        cmd = [
            agl,
            "run",
            "--store",
            self.store_url,
            "--gateway",
            self.gateway.url,
            "--rollout-id",
            rid,
            "--timeout",
            str(timeout - 10),
            "--",
            sys.executable,
            str(AGENTS / script),
        ]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        self.gateway.flush()
        return AgentRun(rid, proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    from transformers import AutoTokenizer

    from agl.store.sqlite import SqliteStore
    from agl_trainer.gateway import Gateway
    from agl_verl.engines.transformers_engine import TransformersEngine
    from agl_verl.models import smollm2_dir

    path = smollm2_dir()
    engine = TransformersEngine(path, max_batch_size=8)
    urls = engine.start()
    db = tmp_path_factory.mktemp("e2e") / "agl.db"
    store = SqliteStore(db)
    gateway = Gateway(store, urls, token=TOKEN, model_version="smollm2-base").start()
    try:
        yield Stack(store, gateway, f"sqlite:///{db}", AutoTokenizer.from_pretrained(path), engine)
    finally:
        gateway.stop()
        engine.stop()
        store.close()
