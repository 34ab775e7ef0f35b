"""The process boundary: agl-core is what an agent process needs, and it stays light.

agl-core may depend on pydantic, httpx, pluggy, python-ulid and packaging only; importing every one of its
modules loads no web server, no console library, no torch and no agent framework,
and nothing of agl-trainer (the training side), which depends on agl-core and not
the other way round.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]

# python-ulid: the time-ordered ids of agl.schema.new_id; packaging: the integrations' tested
# framework ranges (agl.capture.versions). Both tiny, with no dependencies of their own.
CORE_DEPENDENCIES = {"pydantic", "httpx", "pluggy", "python-ulid", "packaging"}

# Modules an agent process must never load through agl-core. (rich is not among them:
# httpx imports it for its command line whenever click, rich and pygments are installed,
# as they are here; the dependency check above keeps it out of an agent's environment.)
FORBIDDEN = (
    "torch",
    "transformers",
    "verl",
    "ray",
    "vllm",
    "numpy",
    "langchain",
    "langchain_core",
    "langgraph",
    "autogen_core",
    "autogen_agentchat",
    "agents",
    "openai",
    "opentelemetry",
    "starlette",
    "uvicorn",
    "agl_trainer",
)


def _dependency_names(pyproject: Path) -> set[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {dep.split(">")[0].split("=")[0].split("[")[0].split("<")[0].split(";")[0].strip().lower() for dep in deps}


def test_core_dependencies_are_light():
    names = _dependency_names(ROOT / "core" / "pyproject.toml")
    assert names <= CORE_DEPENDENCIES, names - CORE_DEPENDENCIES


def _stated_dependencies(readme: Path) -> set[str]:
    """The packages the sentence "... depends on A, B and C only" of ``readme`` names."""
    text = " ".join(readme.read_text().split())
    match = re.search(r"depends on ([\w\-, ]+?) only", text)
    assert match, f"{readme} does not state agl-core's dependencies"
    return {name.strip() for name in re.split(r",| and ", match.group(1)) if name.strip()}


def test_the_docs_state_the_dependencies_core_declares():
    declared = _dependency_names(ROOT / "core" / "pyproject.toml")
    assert declared == CORE_DEPENDENCIES
    assert _stated_dependencies(ROOT / "docs" / "getting-started" / "install.md") == declared
    assert _stated_dependencies(ROOT / "core" / "README.md") == declared


def test_trainer_depends_on_core_in_lockstep():
    # The versions are dynamic (hatch reads each package's __version__): compare the installed metadata.
    project = tomllib.loads((ROOT / "trainer" / "pyproject.toml").read_text())["project"]
    core_version = importlib.metadata.version("agl-core")
    assert importlib.metadata.version("agl-trainer") == core_version
    assert f"agl-core=={core_version}" in project["dependencies"]


def test_importing_every_core_module_loads_nothing_of_the_training_side():
    # In this environment every forbidden package is installed, so an import of one would succeed and show.
    code = (
        "import sys, pkgutil, importlib, agl\n"
        "for m in pkgutil.walk_packages(agl.__path__, 'agl.'):\n"
        "    importlib.import_module(m.name)\n"
        f"print(sorted(n for n in {FORBIDDEN!r} if n in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_agl_trainer_names_point_to_their_package():
    code = "import agl\ntry:\n    agl.Trainer\nexcept AttributeError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install agl-trainer" in out.stdout, out.stdout + out.stderr
