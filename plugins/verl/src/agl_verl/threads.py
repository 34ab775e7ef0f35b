"""How the engine's and the learner's OpenMP threads wait, and how many there are.

torch's CPU kernels run on OpenMP (libgomp). By default a libgomp worker that has
finished its share of a parallel region busy-waits for the next one (``GOMP_SPINCOUNT``
300000, a few milliseconds) before it sleeps. The transformers engine runs hundreds of
small parallel regions per generated token with Python in between, so its workers
spin most of the time: on a machine where another process (an agent's tool servers,
a second engine, the learner) wants the cores, the spinning takes the core from the
thread that has the work, and generation gets several times slower. Measured on two
shared cores: one training step's 24 calls against a lone engine took 194 s with the
default and 29 s with ``OMP_WAIT_POLICY=passive``. ``tests/benchmarks/bench_engine_cpu.py``:
with passive, ``agl engine serve`` spends 0.94–1.08× the CPU per generated token on a busy
machine as on an idle one, against 1.50–1.79× with libgomp's default; on an idle machine
passive costs about 9% of tokens/s (a sleeping worker takes microseconds to wake), which
``OMP_WAIT_POLICY=active`` buys back where the engine has the machine to itself.

libgomp reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, when it is loaded (when
torch is first imported), so :func:`prefer_passive_wait` must run before the first
``import torch`` of the process. ``agl_verl/__init__`` calls it, so that importing
anything of agl_verl (as ``agl`` does through its plugin entry point before any
command runs) is enough. A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept.

Thread counts (:func:`set_torch_threads`): torch's default, one thread per core (or
``OMP_NUM_THREADS``), suits an engine alone and the local trainer, whose engine and
learner take turns in one process (each has its own OpenMP team; with the passive
policy the idle one sleeps). Several processes sharing a machine should split the
cores between them: ``agl engine serve --threads N`` or ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import os
import sys
import warnings

WAIT_POLICY = "OMP_WAIT_POLICY"
"""The OpenMP variable that says whether idle workers spin (``ACTIVE``) or sleep (``PASSIVE``)."""

SPIN_COUNT = "GOMP_SPINCOUNT"
"""libgomp's own variable: how many times an idle worker spins before it sleeps."""

PASSIVE = "PASSIVE"


class ThreadPolicyWarning(RuntimeWarning):
    """torch was imported before agl_verl could choose how its OpenMP threads wait."""


def prefer_passive_wait() -> str | None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``.

    Returns the policy libgomp will use as far as agl can tell: ``PASSIVE`` once set
    here, the user's own setting as given (``"GOMP_SPINCOUNT=..."`` for that one), or
    None when torch was already imported without either: then libgomp has read its
    environment already and spins by default, and a :class:`ThreadPolicyWarning`
    names the variable and what to do.
    """
    for name in (WAIT_POLICY, SPIN_COUNT):
        if os.environ.get(name):
            return os.environ[name] if name == WAIT_POLICY else f"{name}={os.environ[name]}"
    if "torch" in sys.modules:
        warnings.warn(
            f"torch was imported before agl_verl, so its OpenMP threads busy-wait (libgomp's default), which "
            f"makes generation several times slower on a busy machine. Import agl_verl before torch, or set "
            f"{WAIT_POLICY}=passive in the environment before the process starts.",
            ThreadPolicyWarning,
            stacklevel=2,
        )
        return None
    os.environ[WAIT_POLICY] = PASSIVE
    return PASSIVE


def set_torch_threads(threads: int | None, *, what: str = "threads") -> int:
    """Use ``threads`` OpenMP threads for torch in this process (None keeps torch's default) and return the count.

    Call it before the engine or learner runs anything: a thread that has already run
    a parallel region keeps the count it started with. A count below 1 is a ValueError
    naming ``what``.
    """
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"{what}: must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


__all__ = ["PASSIVE", "SPIN_COUNT", "WAIT_POLICY", "ThreadPolicyWarning", "prefer_passive_wait", "set_torch_threads"]
