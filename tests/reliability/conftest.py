"""Helpers for the reliability drills: the real ``agl store serve`` in a subprocess on 127.0.0.1.

The admin token reaches the server through ``--admin-token-file``, never argv; the
database is a SQLite file that survives a SIGKILL, so a restart on the same
file and port is what an operator's supervisor would do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]


def agl_env(**extra: str) -> dict[str, str]:
    """The environment for an ``agl`` subprocess: no AGL_* settings leaking in from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env | extra


class StoreProcess:
    """``agl store serve`` on ``db`` at 127.0.0.1:``port``; ``start()`` waits for /healthz."""

    def __init__(self, db: Path, port: int, token_file: Path, *extra: str, log: Path | None = None):
        self.db, self.port, self.token_file, self.extra = db, port, token_file, extra
        self.log = log or db.with_suffix(".serve.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> StoreProcess:
        args = ["store", "serve", "--store", f"sqlite:///{self.db}", "--port", str(self.port)]
        args += ["--admin-token-file", str(self.token_file), *self.extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([*AGL, *args], cwd=ROOT, env=agl_env(), stdout=log, stderr=log)
        wait_until_serving(f"{self.url}/healthz", self.proc, timeout_s, output=lambda: self.log.read_text()[-2000:])
        return self

    def kill(self) -> None:
        """SIGKILL, no warning: what a crash or the OOM killer does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM and wait: an orderly stop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def rss_kib(self) -> int:
        """The server's resident memory now, from /proc (Linux)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS line")
