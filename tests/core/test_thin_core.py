"""agl-core stays thin: no torch, no agent framework, no verl, in its dependencies or its imports."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

HEAVY = ("torch", "transformers", "verl", "ray", "vllm", "numpy", "langchain", "langchain_core", "langgraph",
         "autogen_core", "autogen_agentchat", "agents", "openai", "opentelemetry")


def test_core_dependencies_are_light():
    project = tomllib.loads((Path(__file__).parents[2] / "core" / "pyproject.toml").read_text())["project"]
    names = [dep.split(">")[0].split("=")[0].split("[")[0].split("<")[0].strip().lower() for dep in project["dependencies"]]
    assert set(names) <= {"pydantic", "httpx", "pluggy", "starlette", "uvicorn", "rich"}, names


def test_importing_every_core_module_loads_nothing_heavy():
    # In this environment every heavy package is installed, so an import of one would succeed and show.
    code = (
        "import sys, pkgutil, importlib, agl\n"
        "for m in pkgutil.walk_packages(agl.__path__, 'agl.'):\n"
        "    importlib.import_module(m.name)\n"
        f"print(sorted(n for n in {HEAVY!r} if n in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
