"""Run every benchmark in turn: ``python -m tests.benchmarks [NAME ...]``.

Each benchmark prints its own figures next to a baseline measured in the same
run. They are not part of the test suite: run them on a quiet machine.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = [m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_")]
    chosen = [n for n in names if not argv or n.removeprefix("bench_") in argv or n in argv]
    if not chosen:
        print(f"no benchmark matches {argv}; known: {', '.join(n.removeprefix('bench_') for n in names)}")
        return 2
    failed = []
    for name in chosen:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, "-m", f"tests.benchmarks.{name}"])
        print(f"=== {name}: exit {code} in {time.monotonic() - started:.0f}s ===", flush=True)
        if code:
            failed.append(name)
    print(
        f"\n{len(chosen) - len(failed)} benchmarks ran, {len(failed)} failed"
        f"{': ' + ', '.join(failed) if failed else ''}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
