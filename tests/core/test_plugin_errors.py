"""A component name nothing provides: the error names the package to install, or the closest name."""

from __future__ import annotations

import pytest

from agl.errors import ConfigError
from agl.plugins import resolve
from agl.providers import not_provided


def test_a_misspelt_component_suggests_the_closest_installed_one():
    with pytest.raises(
        ConfigError, match=r"credit assignment: no plugin provides 'broadcas' \(did you mean 'broadcast'\?"
    ):
        resolve("credit_assignment", "broadcas")


def test_a_component_of_a_package_that_is_not_installed_names_the_package():
    assert (
        not_provided("backend", "verl", [])
        == "no backend 'verl': pip install agl-verl (it provides it; installed: none)"
    )
    assert not_provided("engine", "vllm", ["fake"]).startswith("no engine 'vllm': pip install agl-verl")
