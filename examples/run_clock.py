"""A training seed's wall time across the processes that ran it (a seed resumed after an interruption).

Registered as a plugin for the run, :class:`RunClock` keeps in the work directory the time the
run's processes took up to each one's last completed step, so :meth:`RunClock.wall_s` at the
end is that, plus all of the process that finishes the run. The part of an interrupted step that
was lost is left out: the step is run again and counted then.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import agl


class RunClock:
    """Seconds a run has taken, over every process that worked on it (``path``: a file in its work directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.earlier_s = json.loads(path.read_text())["wall_s"] if path.exists() else 0.0
        """The earlier processes' time, each up to its last completed step."""
        self.started = time.monotonic()

    def wall_s(self) -> float:
        """The earlier processes' time and all of this one's so far."""
        return self.earlier_s + time.monotonic() - self.started

    @agl.hookimpl
    def agl_step_ended(self, step, metrics):
        """Keep the time up to this completed step, for a process that resumes the run."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"wall_s": round(self.wall_s(), 1), "step": step}))
        os.replace(tmp, self.path)
