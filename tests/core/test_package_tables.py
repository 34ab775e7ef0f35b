"""The install page's layout and docs/concepts/architecture.md's package table say what the pyproject files say.

Checked: every package of the repository is in both tables, under its distribution name and
its import name (a real package under its ``src``), and where a page lists a package's
dependencies, the list is that package's own, as ``pyproject.toml`` declares them.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Package:
    folder: str
    name: str
    import_name: str
    dependencies: frozenset[str]


def _packages() -> dict[str, Package]:
    """Every package of the repository, by distribution name, from its pyproject.toml."""
    found = {}
    for pyproject in sorted(ROOT.glob("*/pyproject.toml")) + sorted(ROOT.glob("*/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if not project.get("name", "").startswith("agl-"):
            continue
        src = pyproject.parent / "src"
        (import_name,) = [p.name for p in src.iterdir() if (p / "__init__.py").exists()]
        deps = frozenset(Requirement(d).name.lower() for d in project.get("dependencies", []))
        folder = f"{pyproject.parent.relative_to(ROOT).as_posix()}/"
        found[project["name"]] = Package(folder, project["name"], import_name, deps)
    return found


PACKAGES = _packages()
INSTALL = ROOT / "docs" / "getting-started" / "install.md"
"""The page that holds the repository's layout and what agl-core and agl-trainer depend on."""


def _words(text: str) -> frozenset[str]:
    """``a, b, c and d`` as its items."""
    return frozenset(w.strip().strip("`").lower() for w in re.split(r",|\band\b", " ".join(text.split())) if w.strip())


def test_the_repository_has_the_packages_the_tables_are_checked_against():
    assert {"agl-core", "agl-trainer", "agl-langchain", "agl-otel", "agl-verl", "agl-apo"} <= set(PACKAGES)
    assert PACKAGES["agl-trainer"].import_name == "agl_trainer" and "httpx-sse" in PACKAGES["agl-trainer"].dependencies


# -- docs/getting-started/install.md ------------------------------------------------------------------------------


def _install_layout() -> dict[str, tuple[str, str]]:
    """``{distribution: (folder, import name)}`` from the rows of the install page's layout that name a package."""
    text = INSTALL.read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    rows = re.findall(r"^(\S+/)\s+(agl-[\w-]+)\s+import (\w+)", block, flags=re.MULTILINE)
    return {name: (folder, import_name) for folder, name, import_name in rows}


def test_install_layout_lists_every_package_where_it_is_under_its_names():
    layout = _install_layout()
    assert layout == {p.name: (p.folder, p.import_name) for p in PACKAGES.values()}


def test_install_page_gives_the_dependencies_of_agl_core_and_agl_trainer():
    text = " ".join(INSTALL.read_text().split())
    core = re.search(r"agl-core depends on (.+?) only", text)
    trainer = re.search(r"agl-trainer adds (.+?), and is released", text)
    assert core and trainer
    assert _words(core.group(1)) == PACKAGES["agl-core"].dependencies
    assert _words(trainer.group(1)) == PACKAGES["agl-trainer"].dependencies - {"agl-core"}


# -- docs/concepts/architecture.md ----------------------------------------------------------------


def _architecture_rows() -> list[list[str]]:
    """The cells of each row of the package table (``| package | runs in | holds | depends on |``)."""
    text = (ROOT / "docs" / "concepts" / "architecture.md").read_text()
    table = text.split("| package | runs in | holds | depends on |", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()[2:] if line]


def test_architecture_table_lists_every_package_under_its_names():
    named: dict[str, str] = {}
    for package, *_ in _architecture_rows():
        imports = re.findall(r"`(\w+)`", package)
        name = package.split(" (", 1)[0]
        if name == "integrations":
            for import_name in imports:
                named[next(p.name for p in PACKAGES.values() if p.import_name == import_name)] = import_name
        else:
            assert len(imports) == 1, package
            named[name] = imports[0]
    assert named == {p.name: p.import_name for p in PACKAGES.values()}


@pytest.mark.parametrize("row", _architecture_rows(), ids=lambda row: row[0].split(" (", 1)[0])
def test_architecture_table_gives_each_package_its_own_dependencies(row):
    package, _runs_in, _holds, depends_on = row
    name = package.split(" (", 1)[0]
    if name == "integrations":  # one row for four packages: each depends on agl-core and its framework
        assert depends_on == "agl-core and that framework"
        for import_name in re.findall(r"`(\w+)`", package):
            (found,) = [p for p in PACKAGES.values() if p.import_name == import_name]
            assert "agl-core" in found.dependencies and len(found.dependencies) > 1
        return
    assert _words(depends_on) == PACKAGES[name].dependencies
