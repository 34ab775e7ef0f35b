"""Every public name the API reference renders has a docstring, and each parses as Google style
without a warning.

The names are found as mkdocstrings finds them: griffe loads each package of the API pages with
the extensions, search paths and member filters of mkdocs.yml; from each package, the names in
its ``__all__``, and, of a class, its own members that pass the filters.
"""

from __future__ import annotations

import logging
import re
import textwrap
from pathlib import Path

import griffe
import pytest
import yaml

from tests.docs.conftest import ROOT

API_PAGES = sorted((ROOT / "docs" / "reference" / "api").glob("*.md"))


def handler_options() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())["plugins"][1]["mkdocstrings"]["handlers"]["python"]


def documented_packages() -> list[str]:
    """The packages the API pages render (``::: name`` lines)."""
    names = [m for page in API_PAGES for m in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)]
    assert names, "no ::: directive in docs/reference/api"
    return names


def load(package: str) -> griffe.Module:
    options = handler_options()
    extensions = griffe.load_extensions(*[str(ROOT / e) for e in options["options"]["extensions"]])
    return griffe.load(
        package,
        search_paths=[str(ROOT / p) for p in options["paths"]],
        extensions=extensions,
        docstring_parser=griffe.Parser.google,
        resolve_aliases=True,
        resolve_external=False,
    )


def rendered(obj: griffe.Object, filters: list[re.Pattern]) -> list[griffe.Object]:
    """``obj`` and, for a class, its own members that pass the filters, recursively."""
    if obj.is_alias:
        obj = obj.final_target
    out = [obj]
    if obj.is_class:
        for name, member in obj.members.items():
            if member.is_alias or not all(f.search(name) is None for f in filters):
                continue
            out += rendered(member, filters)
    return out


def exclusion_filters() -> list[re.Pattern]:
    """mkdocs.yml's ``!pattern`` filters, as the patterns a rendered name must not match."""
    filters = handler_options()["options"]["filters"]
    assert all(f.startswith("!") for f in filters), "only exclusion filters are understood here"
    return [re.compile(f[1:]) for f in filters]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def parse_warnings(objects: list[griffe.Object]) -> list[str]:
    """What griffe warns while parsing the objects' docstrings as Google style (as mkdocstrings does)."""
    collect = _Collect()
    logger = logging.getLogger("griffe")
    logger.addHandler(collect)
    try:
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring.parse(griffe.Parser.google)
    finally:
        logger.removeHandler(collect)
    return collect.messages


@pytest.mark.parametrize("package", documented_packages())
def test_every_rendered_name_has_a_google_style_docstring(package):
    module = load(package)
    exports = [str(n) for n in module.exports or ()]
    assert exports, f"{package} has no __all__: the API page would render whatever it imports"
    objects = [module] + [o for name in exports for o in rendered(module.members[name], exclusion_filters())]
    missing = [
        f"{o.path} ({o.relative_filepath}:{o.lineno})"
        for o in objects
        if not (o.docstring and o.docstring.value.strip())
    ]
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)
    warnings = parse_warnings(objects)
    assert not warnings, "docstrings that do not parse as Google style:\n" + "\n".join(warnings)


def test_the_check_sees_a_missing_docstring(tmp_path: Path):
    """The walk finds an undocumented method of an exported class (and not a private one), and the
    parse check a Google-style section naming a parameter the function does not have."""
    package = tmp_path / "probe_pkg"
    package.mkdir()
    source = '''
        """A probe."""

        __all__ = ["Thing"]


        class Thing:
            """A thing."""

            def documented(self):
                """Yes."""

            def bare(self):
                pass

            def _private(self):
                pass

            def wrong(self, depth: int):
                """Go.

                Args:
                    height: how high.
                """
    '''
    (package / "__init__.py").write_text(textwrap.dedent(source))
    module = griffe.load("probe_pkg", search_paths=[str(tmp_path)])
    objects = rendered(module.members["Thing"], exclusion_filters())
    assert [o.name for o in objects if not o.docstring] == ["bare"]
    assert any("'height' does not appear in the function signature" in w for w in parse_warnings(objects))


def test_pydantic_fields_render_their_descriptions():
    """A field's ``Field(description=...)`` is its docstring in the reference, a computed one (an
    f-string) as pydantic holds it; reST markup in docstrings is Markdown by then."""
    from agl_trainer.config import TrainerConfig

    config = load("agl_trainer").members["TrainerConfig"].final_target
    for name in ("steps", "store"):
        assert config.members[name].docstring.value == TrainerConfig.model_fields[name].description
    assert "$AGL_STORE_URL" in config.members["store"].docstring.value
    runner = load("agl").members["Runner"].final_target
    assert ":class:" not in runner.docstring.value and "`~agl.credentials.RolloutKeys`" not in runner.docstring.value
    assert "`agl.credentials.RolloutKeys`" in runner.docstring.value
