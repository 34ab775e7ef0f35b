#!/usr/bin/env bash
# Checks that the install page's pip lines (docs/getting-started/install.md) work from nothing: builds wheels of this repository's
# packages, installs them into a fresh virtual environment in a temporary directory by the
# page's own lines (with --find-links pointing at the built wheels, as if they were on PyPI),
# imports agl, agl_trainer, agl_langchain, agl_verl and the verl backend, then installs
# agl-verl[distributed] and imports what verl's V1 trainer and its Ray workers import (TransferQueue
# included; not vLLM, which needs CUDA), runs `pip check`, and fails if any nvidia-* (CUDA)
# package was installed.
#
#   scripts/check-install.sh            # PYTHON=python3.11 by default
#
# The CPU torch line is the install page's: `pip install torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cpu`. Where that host cannot be reached (a machine that
# reaches package registries only, with a CPU wheel on pip's find-links), it falls back to the
# page's other CPU line, `pip install torch==2.13.0`, and says so.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PACKAGES=(core trainer integrations/langchain integrations/autogen integrations/openai-agents integrations/otel plugins/verl plugins/apo)

start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/agl-check-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { printf '[%4ds] %s\n' "$(($(date +%s) - start))" "$*"; }

step "clean virtual environment in $work/venv ($($PYTHON --version))"
$PYTHON -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip

step "building wheels: ${PACKAGES[*]}"
"${pip[@]}" wheel -q --no-deps -w "$work/wheels" "${PACKAGES[@]/#/./}"
ls "$work/wheels"

# The install page's lines, CPU: torch first, then the packages.
if "$work/venv/bin/python" -c "import socket, sys, urllib.parse; socket.getaddrinfo(urllib.parse.urlparse(sys.argv[1]).hostname, 443)" "$TORCH_INDEX" 2>/dev/null; then
    step "pip install torch==2.13.0 --index-url $TORCH_INDEX"
    "${pip[@]}" install -q torch==2.13.0 --index-url "$TORCH_INDEX"
else
    step "$TORCH_INDEX cannot be reached: pip install torch==2.13.0 (the CPU wheel on pip's find-links)"
    "${pip[@]}" install -q torch==2.13.0
fi
step "pip install agl-core agl-langchain agl-verl (--find-links $work/wheels)"
"${pip[@]}" install -q --find-links "$work/wheels" agl-core agl-langchain agl-verl

step "imports"
"$work/venv/bin/python" - <<'EOF'
import importlib
import importlib.metadata as md
import time

for name in ("agl", "agl_trainer", "agl_langchain", "agl_verl", "agl_verl.backend"):
    t = time.perf_counter()
    module = importlib.import_module(name)
    print(f"  import {name:<18} {time.perf_counter() - t:5.1f} s  {getattr(module, '__version__', '')}")
from agl_verl.backend import VerlBackend  # noqa: E402,F401

import torch  # noqa: E402

versions = {d: md.version(d) for d in ("torch", "verl", "tensordict", "transformers", "ray", "langchain-core")}
print("  " + ", ".join(f"{d} {v}" for d, v in versions.items()))
assert versions["verl"] == "0.9.1", versions
assert torch.version.cuda is None, f"a CUDA build of torch was installed: {torch.__version__}"
EOF

# Distributed mode: the GPU how-to's `agl-verl[distributed]` line, then every module verl's driver,
# its task runner and its Ray workers (agent loops, TransferQueue, FSDP engine workers) import in
# that mode, except vLLM's rollout server, which needs CUDA to import (agl-verl[gpu] brings it).
step "pip install agl-verl[distributed] (--find-links $work/wheels)"
"${pip[@]}" install -q --find-links "$work/wheels" "agl-verl[distributed]"
step "imports of distributed mode (driver and Ray workers)"
"$work/venv/bin/python" - <<'EOF'
import importlib
import time

MODULES = (
    "agl_verl",  # first: it sets OpenMP's wait policy before torch is imported
    "transfer_queue",
    "verl.trainer.main_ppo",
    "verl.trainer.ppo.v1",
    "verl.trainer.ppo.v1.agent_loop_tq",
    "verl.trainer.ppo.v1.trainer_base",
    "verl.experimental.agent_loop",
    "verl.workers.rollout.llm_server",
    "verl.workers.rollout.router",
    "verl.workers.engine_workers",
    "verl.workers.engine.fsdp.transformer_impl",
    "verl.utils.dataset.rl_dataset",
    "agl_verl.distributed",
    "agl_verl.launch",
    "agl_verl.task_runner",
    "agl_verl.worker_context",
    "agl_verl.manager",
)
for name in MODULES:
    t = time.perf_counter()
    importlib.import_module(name)
    print(f"  import {name:<42} {time.perf_counter() - t:5.1f} s")
EOF

step "pip check"
"${pip[@]}" check

step "no nvidia-* packages"
nvidia=$("${pip[@]}" list --format=freeze 2>/dev/null | grep -i '^nvidia-' || true)
if [ -n "$nvidia" ]; then
    echo "CUDA packages were installed:" >&2
    echo "$nvidia" >&2
    exit 1
fi
count=$("${pip[@]}" list --format=freeze 2>/dev/null | wc -l)
size=$(du -sm "$work/venv" | cut -f1)
step "ok: $count distributions, ${size} MiB, no nvidia-* package"
