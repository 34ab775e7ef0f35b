"""agl.capture.versions: tested framework ranges (compared by packaging), checked at instrument time."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from agl.capture import versions
from agl.capture.versions import (
    UnsupportedVersionError,
    UntestedVersionWarning,
    check_version,
    parse_requirement,
    satisfies,
)
from agl.env import STRICT_VERSIONS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(versions, "_warned", set())
    monkeypatch.delenv(STRICT_VERSIONS, raising=False)


@pytest.mark.parametrize(
    ("version", "requirement", "inside"),
    [
        ("0.24.0", "openai-agents>=0.24,<0.25", True),
        ("0.24.17", "openai-agents>=0.24,<0.25", True),
        ("0.25.0", "openai-agents>=0.24,<0.25", False),
        ("0.23.9", "openai-agents>=0.24,<0.25", False),
        ("0.25.0rc1", "openai-agents>=0.24,<0.25", False),  # PEP 440: <V leaves out V's pre-releases
        ("0.24.1rc1", "openai-agents>=0.24,<0.25", True),
        ("0.24.0.post1", "x>=0.24,<=0.24", False),
        ("0.24", "x==0.24.0", True),
        ("1.7.2", "langchain-core>=1.0,<2", True),
        ("2.0.0a1", "langchain-core>=1.0,<2", False),
        ("2.0.0", "langchain-core>=1.0,<2", False),
        ("0.66b2", "x>=0.51b0,<1", True),
        ("0.51a9", "x>=0.51b0,<1", False),
        ("1.0.dev3", "x<1.0a1", True),
        ("0.9.0", "tensordict>=0.8,<=0.10.0,!=0.9.0", False),
        ("0.10.0", "tensordict>=0.8,<=0.10.0,!=0.9.0", True),
        ("2.13.0+cpu", "torch>=2.4", True),
        ("10.0", "x>9.0", True),
        ("9.0", "x>9.0", False),
    ],
)
def test_satisfies(version, requirement, inside):
    assert satisfies(version, requirement) is inside


PLAIN_VERSIONS = ["0", "1", "1.0", "1.0.0", "01.2", "1.2", "1.2.0.0", "1.10", "1.9.9", "2", "2.0.1", "10.0.0"]
PLAIN_CLAUSES = [f"{op}{v}" for op in (">=", ">", "<=", "<", "==", "!=") for v in ("1", "1.0", "1.2", "1.10.0", "2")]


def test_plain_versions_and_ranges_compare_as_packaging_compares_them():
    from packaging.version import Version

    ranges = [*PLAIN_CLAUSES, *(f"{a}, {b}" for a in PLAIN_CLAUSES[::3] for b in PLAIN_CLAUSES[1::4]), ""]
    for text in ranges:
        assert versions._plain_requirement(f"fw{text}") is not None, text
        for version in PLAIN_VERSIONS:
            expected = SpecifierSet(text).contains(Version(version), prereleases=True)
            assert satisfies(version, f"fw{text}") is expected, (version, text)


def test_checking_a_plain_range_loads_no_packaging_module():
    code = (
        "import sys\n"
        "before = {m for m in sys.modules if m.startswith('packaging.')}\n"
        "from agl.capture.versions import check_version\n"
        "assert check_version('agl_x', 'pytest>=1,<1000', still_works='a', may_break='b') is True\n"
        "print(sorted({m for m in sys.modules if m.startswith('packaging.')} - before))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_parse_requirement():
    name, specifier = parse_requirement("openai-agents >= 0.24, < 0.25")
    assert name == "openai-agents" and specifier == SpecifierSet(">=0.24,<0.25")
    assert parse_requirement("verl") == ("verl", SpecifierSet())
    with pytest.raises(ValueError, match="not a requirement"):
        parse_requirement("x>=one two")
    with pytest.raises(ValueError, match="not a version"):
        satisfies("one", "x>=1")


def test_inside_the_range_nothing_happens(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda dist: "0.24.3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_version("agl_x", "fw>=0.24,<0.25", still_works="a", may_break="b") is True


def test_outside_the_range_warns_once_naming_version_range_and_what_still_works(monkeypatch):
    asked = []
    monkeypatch.setattr(versions, "installed_version", lambda dist: asked.append(dist) or "0.31.0")
    with pytest.warns(UntestedVersionWarning) as caught:
        assert check_version("agl_x", "fw>=0.24,<0.25", still_works="the processor", may_break="the hooks") is False
    assert asked == ["fw"]
    message = str(caught[0].message)
    assert "fw 0.31.0 is installed" in message
    assert "tested with fw>=0.24,<0.25" in message
    assert "Still works: the processor" in message
    assert "May not work on this version: the hooks" in message
    assert "AGL_STRICT_VERSIONS=1" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time is silent
        assert check_version("agl_x", "fw>=0.24,<0.25", still_works="the processor", may_break="the hooks") is False


def test_strict_raises_instead(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda dist: "0.31.0")
    monkeypatch.setenv(STRICT_VERSIONS, "1")
    with pytest.raises(UnsupportedVersionError, match=r"tested with fw>=0\.24,<0\.25, but fw 0\.31\.0 is installed"):
        check_version("agl_x", "fw>=0.24,<0.25", still_works="a", may_break="b")


def test_an_unreadable_installed_version_counts_as_untested(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda dist: "nightly")
    with pytest.warns(UntestedVersionWarning, match="fw nightly is installed"):
        assert check_version("agl_x", "fw>=0.24,<0.25", still_works="a", may_break="b") is False


def test_no_metadata_is_not_checked():
    assert versions.installed_version("no-such-distribution-agl") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_version("agl_x", "no-such-distribution-agl>=1,<2", still_works="a", may_break="b") is True


def test_the_real_lookup_reads_installed_metadata():
    assert versions.installed_version("pluggy") == importlib.metadata.version("pluggy")


# -- every package: one version source, the lockstep pins, the declared ranges -----------------------

PACKAGES = {
    "core": ("agl-core", "agl"),
    "trainer": ("agl-trainer", "agl_trainer"),
    "integrations/langchain": ("agl-langchain", "agl_langchain"),
    "integrations/autogen": ("agl-autogen", "agl_autogen"),
    "integrations/openai-agents": ("agl-openai-agents", "agl_openai_agents"),
    "integrations/otel": ("agl-otel", "agl_otel"),
    "plugins/verl": ("agl-verl", "agl_verl"),
}


def _pyproject(directory: str) -> dict:
    return tomllib.loads((ROOT / directory / "pyproject.toml").read_text())


@pytest.mark.parametrize("directory", sorted(PACKAGES))
def test_one_version_source_and_publishable_metadata(directory):
    distribution, module_name = PACKAGES[directory]
    project = _pyproject(directory)["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    tool = _pyproject(directory)["tool"]["hatch"]
    init = ROOT / directory / tool["version"]["path"]
    assert init == ROOT / directory / "src" / module_name / "__init__.py"
    assert (init.parent / "py.typed").is_file()
    assert (ROOT / directory / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert "Copyright (c) 2026 the agl authors" in (ROOT / "LICENSE").read_text()
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "Typing :: Typed" in project["classifiers"]
    assert set(project["urls"]) == {"Homepage", "Repository", "Issues", "Documentation"}
    # the installed (editable) metadata carries the version written in __init__.py
    written = re.search(r'^__version__ = "([^"]+)"$', init.read_text(), re.MULTILINE)
    assert written is not None
    assert importlib.metadata.version(distribution) == written[1]


def test_lockstep_pins_name_the_core_version():
    core = importlib.metadata.version("agl-core")
    pins = []
    for directory in PACKAGES:
        project = _pyproject(directory)["project"]
        requirements = list(project["dependencies"])
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        own = project["name"]  # an extra naming the package's own other extras is no pin
        pins += [r for r in requirements if r.startswith(("agl-", "agl_")) and parse_requirement(r)[0] != own]
    assert pins, "no lockstep pins found"
    for pin in pins:
        _name, specifier = parse_requirement(pin)
        assert specifier == SpecifierSet(f"=={core}"), pin


@pytest.mark.parametrize(
    ("directory", "module", "framework"),
    [
        ("integrations/langchain", "agl_langchain.instrument", "langchain-core"),
        ("integrations/autogen", "agl_autogen.instrument", "autogen-agentchat"),
        ("integrations/openai-agents", "agl_openai_agents.instrument", "openai-agents"),
        ("integrations/otel", "agl_otel.instrument", "opentelemetry-sdk"),
    ],
)
def test_tested_ranges_sit_inside_the_install_ranges_and_hold_the_installed_framework(directory, module, framework):
    import importlib

    tested = importlib.import_module(module).TESTED
    name, specifier = parse_requirement(tested)
    assert name == framework
    declared = [d for d in _pyproject(directory)["project"]["dependencies"] if parse_requirement(d)[0] == framework]
    assert len(declared) == 1, declared
    # the tested range's bounds are allowed by the install range
    for spec in specifier:
        if spec.operator == ">=":
            assert satisfies(spec.version, declared[0]), (tested, declared[0])
    # this environment (the one the tests run in) is inside the tested range
    assert satisfies(importlib.metadata.version(framework), tested)
