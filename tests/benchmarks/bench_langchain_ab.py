"""agl-langchain's cost against another checkout's, the two taking turns in fresh processes.

Each round runs, for each checkout in turn (the order alternating from round to round), three
fresh processes importing that checkout's sources (``AGL_LOAD_PLUGINS`` empty: no plugin):

- **time**: one chat-model call of langchain-core's ``GenericFakeChatModel`` (system + user
  message), in interleaved blocks of plain calls, calls with ``AglCallbackHandler`` passed in
  ``config`` and calls captured by ``agl_langchain.instrument()`` (zero-line), inside a rollout
  whose spans go through a real ``BufferedWriter`` into a real SQLite store: the p50 of each,
  and capture's added p50 (capture minus plain, in the same process);
- **memory, capture off** and **memory, capture on**: the same calls, ``--memory-calls`` of
  them, in a process without and with ``AGL_LANGCHAIN_INSTRUMENT=1`` (the zero-line switch,
  spans written to a SQLite store named by ``AGL_STORE_URL``): the peak resident set
  (``VmHWM``) of each. The capture-on process sets the switch and runs the checkout's own
  ``agl_langchain.pth`` line as its first statement, as ``site`` does at interpreter start:
  the ``.pth`` installed in the interpreter's site-packages is the current checkout's, whose
  line an older checkout's sources cannot run.

Compare the two checkouts within a round and across rounds (the host is shared: ratios and
differences, not absolute figures).

``--bytecode-cache`` measures the processes as an installed package runs (its modules' bytecode
compiled once, as pip does at install), where this environment's ``PYTHONDONTWRITEBYTECODE``
otherwise has every process compile the checkouts' sources again, which leaves about a MiB of
the compiler's memory behind in the capture-on process (agl's modules are the ones compiled
there; LangChain's come with their bytecode): the children get a shared
``PYTHONPYCACHEPREFIX``, filled by a warm-up turn of each checkout before the rounds.

    .venv/bin/python -m tests.benchmarks.bench_langchain_ab [--against 28dbf9d | --other CHECKOUT] \\
        [--rounds 3] [--calls 3000] [--memory-calls 5000] [--bytecode-cache]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.benchmarks.bench_gateway_ab import SOURCES, _load, take_turns
from tests.benchmarks.store_beside import add_other_checkout, other_checkout

ROOT = Path(__file__).resolve().parents[2]
AGAINST = "28dbf9d"
"""The commit compared against by default: the gateway's and the LangChain handler's fastest (issue 46)."""

_COMMON = """
import itertools, json, sys, time
from pathlib import Path
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

PROMPT = [SystemMessage("You are a careful assistant."), HumanMessage("What is 2 + 3? Answer briefly.")]
model = GenericFakeChatModel(messages=itertools.cycle([AIMessage("5")]))

def peak_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
"""

_TIME = (
    _COMMON
    + """
import statistics
import agl, agl_langchain
from agl.capture import BufferedWriter
from agl.store.sqlite import SqliteStore
from agl_langchain import AglCallbackHandler

calls, block = int(sys.argv[1]), 250
store = SqliteStore(Path(sys.argv[2]))
writer = BufferedWriter(store)
handler = AglCallbackHandler()
explicit = {"callbacks": [handler]}
samples = {"plain": [], "handler": [], "zero_line": []}

def timed(config, out, n):
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        model.invoke(PROMPT, config)
        out.append((clock() - t0) / 1000.0)

with agl.use_rollout(agl.RolloutContext(rollout_id="ro-bench", writer=writer)):
    for config in (None, explicit):
        timed(config, [], 300)
    for _ in range(max(1, calls // block)):
        timed(None, samples["plain"], block)
        timed(explicit, samples["handler"], block)
        agl_langchain.instrument(handler)
        timed(None, samples["zero_line"], block)
        agl_langchain.uninstrument()
    writer.flush()
p50 = {name: statistics.median(s) for name, s in samples.items()}
print(json.dumps({**{f"{k}_p50_us": v for k, v in p50.items()}, "errors": handler.errors}))
"""
)

_SWITCH_ON = """
import os, sys
from pathlib import Path
os.environ["AGL_LANGCHAIN_INSTRUMENT"] = "1"
for line in Path(sys.argv[2]).read_text().splitlines():  # what site does with a .pth file's lines
    if line.startswith("import "):
        exec(line)
"""
"""The capture-on process's first statements: the switch on, then the checkout's ``.pth`` line run."""

_MEMORY = (
    _COMMON
    + """
for _ in range(int(sys.argv[1])):
    model.invoke(PROMPT)
if "agl_langchain" in sys.modules:  # capture on: everything written before the peak is read
    from agl.capture import production_writer
    production_writer().flush()
print(json.dumps({"peak_mib": peak_mib(), "captured": "agl_langchain" in sys.modules}))
"""
)


def environ(checkout: Path, **extra: str) -> dict[str, str]:
    """This environment less agl's variables, with ``checkout``'s sources first and no plugins."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    path = os.pathsep.join(str(checkout / part) for part in SOURCES)
    return base | {"PYTHONPATH": path, "AGL_LOAD_PLUGINS": ""} | extra


def child_figures(checkout: Path, code: str, args: list[str], **extra: str) -> dict:
    """Run ``code`` with ``args`` in a fresh process on ``checkout``'s sources, in a temporary directory with its
    capture store; the JSON object its last line of output prints."""
    with tempfile.TemporaryDirectory(prefix="agl-bench-lc-") as tmp:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=tmp,
            env=environ(checkout, AGL_STORE_URL=f"sqlite:///{tmp}/capture.db", **extra),
            capture_output=True,
            text=True,
            check=False,
            timeout=1200,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_turn(checkout: Path, args: argparse.Namespace) -> dict:
    """One checkout's figures, each from a fresh process."""
    with tempfile.TemporaryDirectory(prefix="agl-bench-lc-") as tmp:
        out = child_figures(checkout, _TIME, [str(args.calls), f"{tmp}/bench.db"])
    out["added_handler_us"] = out["handler_p50_us"] - out["plain_p50_us"]
    out["added_zero_line_us"] = out["zero_line_p50_us"] - out["plain_p50_us"]
    out["peak_off_mib"] = child_figures(checkout, _MEMORY, [str(args.memory_calls)])["peak_mib"]
    pth = checkout / "integrations/langchain/src/agl_langchain.pth"
    on = child_figures(checkout, _SWITCH_ON + _MEMORY, [str(args.memory_calls), str(pth)])
    if not on["captured"]:
        raise RuntimeError(f"{checkout}: AGL_LANGCHAIN_INSTRUMENT=1 did not load agl_langchain")
    out["peak_on_mib"] = on["peak_mib"]
    return out


COLUMNS = (
    ("plain_p50_us", "plain p50 us"),
    ("added_handler_us", "handler +us"),
    ("added_zero_line_us", "zero-line +us"),
    ("peak_off_mib", "off MiB"),
    ("peak_on_mib", "on MiB"),
)


def report(turns: list[tuple[int, str, dict]], names: list[str]) -> None:
    print(f"{'round':>5}  {'checkout':<8}" + "".join(f"{title:>15}" for _, title in COLUMNS) + f"{'on - off':>10}")
    for rnd, name, t in turns:
        cells = "".join(f"{t[key]:>15.1f}" for key, _ in COLUMNS)
        print(f"{rnd:>5}  {name:<8}{cells}{t['peak_on_mib'] - t['peak_off_mib']:>10.1f}")
    print("medians over the rounds (this vs the other):")
    med = {n: {k: statistics.median(t[k] for _, name, t in turns if name == n) for k, _ in COLUMNS} for n in names}
    for key, title in COLUMNS:
        print(f"  {title:<15} {med[names[0]][key]:8.1f} vs {med[names[1]][key]:8.1f}")
    for n in names:
        gaps = [t["peak_on_mib"] - t["peak_off_mib"] for _, name, t in turns if name == n]
        print(f"  {n}: capture on minus off, peak MiB: {statistics.median(gaps):.1f} (each round: {gaps})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_other_checkout(parser, AGAINST)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000, help="timed calls of each set-up in each turn")
    parser.add_argument("--memory-calls", type=int, default=5000)
    parser.add_argument(
        "--bytecode-cache", action="store_true", help="children run from compiled bytecode, as an installed package"
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        other = other_checkout(args, stack)
        if args.bytecode_cache:
            use_bytecode_cache(stack.enter_context(tempfile.TemporaryDirectory(prefix="agl-bench-pyc-")), [ROOT, other])
        run(ROOT, other, args)


def use_bytecode_cache(prefix: str, checkouts: list[Path]) -> None:
    """Have every child read and write compiled bytecode under ``prefix``, then fill it for each checkout."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    for checkout in checkouts:
        pth = checkout / "integrations/langchain/src/agl_langchain.pth"
        child_figures(checkout, _SWITCH_ON + _MEMORY, ["10", str(pth)])
        with tempfile.TemporaryDirectory(prefix="agl-bench-lc-") as tmp:
            child_figures(checkout, _TIME, ["250", f"{tmp}/bench.db"])


def run(this: Path, other: Path, args: argparse.Namespace) -> None:
    """Every round's turns, then the table."""
    checkouts = {"this": this, "other": other}
    names = list(checkouts)
    cache = os.environ.get("PYTHONPYCACHEPREFIX") if "PYTHONDONTWRITEBYTECODE" not in os.environ else None
    print(f"this: {this}; other: {checkouts['other']}; {os.cpu_count()} cores; load {_load()}; bytecode cache: {cache}")
    turns = take_turns(checkouts, args.rounds, lambda checkout: one_turn(checkout, args))
    report(turns, names)


if __name__ == "__main__":
    main()
