"""The vLLM tests take minutes (a vLLM server start on CPU): they run only when asked for by marker.

``pytest -m vllm tests/vllm`` (or any ``-m`` expression naming vllm) selects them; a plain
``pytest tests`` deselects them, so the default suite does not need .venv-vllm.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    if "vllm" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if "vllm" not in item.keywords]
    dropped = [item for item in items if "vllm" in item.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def smollm2_path():
    from agl_verl.models import smollm2_dir

    return smollm2_dir()
