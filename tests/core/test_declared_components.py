"""What a plugin package provides is declared in its own entry points (``agl.<kind>``), not in agl-core.

The installed packages' metadata is read as it is (agl-verl and agl-apo are installed with the
suite); the test holds each declaration to what the plugin registers when it loads.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from agl.plugins import ENTRY_POINT_GROUP, list_plugins
from agl.providers import KINDS, declared_by, not_provided


def _declared() -> dict[str, dict[str, list[str]]]:
    """``{plugin entry point: {kinds: [names]}}`` from the ``agl.<kind>`` entry points of the installed packages."""
    plugin_of = {ep.dist.name: ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.dist is not None}
    out: dict[str, dict[str, list[str]]] = {}
    for kind in KINDS:
        for ep in entry_points(group=f"{ENTRY_POINT_GROUP}.{kind}"):
            assert ep.dist is not None and ep.dist.name in plugin_of, f"{ep}: declared by a package with no agl plugin"
            out.setdefault(plugin_of[ep.dist.name], {}).setdefault(f"{kind}s", []).append(ep.name)
    return out


def test_each_installed_plugin_declares_exactly_what_it_registers():
    declared = _declared()
    assert declared["verl"] == {"backends": ["verl"], "engines": ["transformers", "vllm"], "commands": ["engine"]}
    installed = {row["name"]: row["provides"] for row in list_plugins() if row["name"] in {"verl", "apo", "otel"}}
    for plugin, provides in installed.items():
        registered = {kind: sorted(n.split(" (", 1)[0] for n in names) for kind, names in provides.items()}
        assert {k: sorted(v) for k, v in declared.get(plugin, {}).items()} == registered, plugin


def test_the_package_that_declares_a_name_is_found_without_importing_it():
    assert declared_by("backend", "verl") == "agl-verl"
    assert declared_by("engine", "vllm") == "agl-verl"
    assert declared_by("backend", "apo") == "agl-apo"
    assert declared_by("backend", "no-such-backend") is None
    assert declared_by("engine", "verl") is None  # a name is declared for its kind only
    with pytest.raises(ValueError, match="kind: no kind 'backends'"):
        declared_by("backends", "verl")


def test_a_name_no_package_declares_gets_the_closest_provided_one():
    assert not_provided("backend", "verll", ["verl"]) == (
        "backend: no plugin provides 'verll' (did you mean 'verl'? installed: verl; see agl plugins)"
    )
