"""``agl.env``: every ``AGL_*`` variable is named once, there; the code, the ``.pth`` files, README
and the documentation's pages name only what it declares. (The table of the variables is not written
by hand any more: the documentation's environment reference is generated from ``agl.env``.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agl import env

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("core", "trainer", "integrations", "plugins", "examples")
"""The folders whose code must name variables through :mod:`agl.env`."""

NAME = re.compile(r"\bAGL_[A-Z][A-Z0-9_]*\b")


NOT_VARIABLES = {
    "AGL_OTEL_INSTRUMENT": "integrations/otel/README.md says there is no such variable",
    "AGL_REPO": "agl.env's docstrings: a user's own name, which agl draws no warning for",
}
"""``AGL_*`` names the docs may mention that agl does not read."""


def _python_files():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ".venv" not in path.parts and "node_modules" not in path.parts:
                yield path


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand alone as statements: docstrings, module or attribute."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _literals_naming_variables(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of each variable name in a string of ``path`` that is not documentation."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _documentation(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found += [(node.lineno, name) for name in NAME.findall(node.value)]
    return found


def test_no_string_outside_agl_env_names_a_variable():
    """A new ``os.environ.get("AGL_...")`` (or a message spelling a name out) anywhere but agl/env.py fails here."""
    found = []
    for path in _python_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative == "core/src/agl/env.py":
            continue
        found += [f"{relative}:{line}: {name}" for line, name in _literals_naming_variables(path)]
    assert not found, "use the constant in agl.env instead:\n" + "\n".join(found)


def test_the_check_catches_a_literal(tmp_path):
    """The scan above is not vacuous: a literal is found, a docstring naming the variable is not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Reads ``AGL_STORE_URL``."""\nimport os\n\nos.environ.get("AGL_NEW_THING")\nf"set AGL_X={1}"\n'
    )
    assert sorted(_literals_naming_variables(sample)) == [(4, "AGL_NEW_THING"), (5, "AGL_X")]


def test_every_name_the_code_and_docs_mention_is_declared():
    """Docstrings, comments and READMEs may name variables, but only ones agl.env declares (or retired,
    renamed ones)."""
    known = set(env.VARIABLES) | set(env.RETIRED) | set(env.RENAMED) | set(env.READ_ELSEWHERE) | set(NOT_VARIABLES)
    paths = [ROOT / "README.md", *_python_files(), *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in SCANNED:
        paths += sorted(p for p in (ROOT / folder).rglob("*.md") if "node_modules" not in p.parts)
    unknown = []
    for path in paths:
        relative = path.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            unknown += [f"{relative}:{lineno}: {name}" for name in NAME.findall(line) if name not in known]
    assert not unknown, "declare these in agl.env (or fix the name):\n" + "\n".join(unknown)


@pytest.mark.parametrize(
    "pth, variable",
    [
        ("integrations/langchain/src/agl_langchain.pth", env.LANGCHAIN_INSTRUMENT),
        ("integrations/autogen/src/agl_autogen.pth", env.AUTOGEN_INSTRUMENT),
        ("integrations/openai-agents/src/agl_openai_agents.pth", env.OPENAI_AGENTS_INSTRUMENT),
    ],
)
def test_each_pth_file_spells_the_name_agl_env_declares(pth, variable):
    """The .pth files run before imports, so they spell the name out: it must be the declared one."""
    lines = (ROOT / pth).read_text().splitlines()
    code = [line for line in lines if not line.startswith("#")]
    assert len(code) == 1 and NAME.findall(code[0]) == [variable]
    assert any(line.startswith("#") and f"agl.env.{_constant(variable)}" in line for line in lines)


def _constant(variable: env.Variable) -> str:
    return next(name for name, value in vars(env).items() if value is variable)


def test_each_variable_is_declared_once_and_documented():
    names = [str(v) for v in env.VARIABLES]
    assert len(names) == len(set(names))
    for variable in env.VARIABLES:
        assert variable.what and variable.read_by and variable.default, variable
    assert not set(env.RETIRED) & set(names)
    with pytest.raises(ValueError, match="start with AGL_"):
        env.Variable("STORE_URL", what="w", read_by="r", default="d")


def test_a_variable_is_its_name_and_reads_the_environment(monkeypatch):
    monkeypatch.setenv("AGL_STORE_URL", "sqlite:///x.db")
    assert env.STORE_URL == "AGL_STORE_URL" and f"${env.STORE_URL}" == "$AGL_STORE_URL"
    assert env.STORE_URL.get() == "sqlite:///x.db"
    monkeypatch.delenv("AGL_STORE_URL")
    assert env.STORE_URL.get() is None


def test_a_retired_variable_in_use_names_its_successor(monkeypatch):
    monkeypatch.delenv("AGL_UPSTREAM_API_KEY", raising=False)
    assert env.retired_in_use() == []
    monkeypatch.setenv("AGL_UPSTREAM_API_KEY", "k")
    assert env.retired_in_use() == ["$AGL_UPSTREAM_API_KEY is no longer read: set $AGL_ENGINE_API_KEY instead"]


def test_an_unknown_variable_is_named_with_the_one_it_likely_meant():
    """A renamed switch (``AGL_LANGCHAIN``), misspellings (a swap, a dropped letter, an extra
    one); agl's own variables, retired ones, those the tests and setup scripts read, and names
    far from all of agl's (a user's ``AGL_REPO``) are not unknown."""
    environ = {
        "AGL_LANGCHAIN": "1",
        "AGL_STORE_ULR": "x",
        "AGL_STORE_TOKN": "x",
        "AGL_ROLLOUT_KEYS": "k",
        "AGL_NOTHING_LIKE_IT": "1",
        "AGL_REPO": "x",
        "AGL_VENV": "x",
        "AGL_STORE": "x",
        "AGL_STORE_URL": "x",
        "AGL_UPSTREAM_API_KEY": "k",
        **dict.fromkeys(env.READ_ELSEWHERE, "1"),
        "PATH": "/bin",
    }
    assert env.unknown(environ) == {
        "AGL_LANGCHAIN": "AGL_LANGCHAIN_INSTRUMENT",
        "AGL_STORE_ULR": "AGL_STORE_URL",
        "AGL_STORE_TOKN": "AGL_STORE_TOKEN",
        "AGL_ROLLOUT_KEYS": "AGL_ROLLOUT_KEY",
    }
    assert env.unknown_line("AGL_LANGCHAIN", "AGL_LANGCHAIN_INSTRUMENT") == (
        "$AGL_LANGCHAIN is set but agl reads no such variable; did you mean $AGL_LANGCHAIN_INSTRUMENT?"
    )


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("AGL_STORE_URL", "AGL_STORE_URL", 0),
        ("AGL_STORE_ULR", "AGL_STORE_URL", 1),  # a swap of neighbours is one edit
        ("AGL_STORE_TOKN", "AGL_STORE_TOKEN", 1),
        ("AGL_STOR_TOKN", "AGL_STORE_TOKEN", 2),
        ("AGL_STR_TOKN", "AGL_STORE_TOKEN", 3),  # past the limit: limit + 1
        ("AGL_REPO", "AGL_ROLLOUT_ID", 3),
    ],
)
def test_edit_distance_counts_single_character_edits_up_to_its_limit(a, b, distance):
    assert env.edit_distance(a, b) == distance == env.edit_distance(b, a)


def test_an_unknown_variable_is_warned_about_once_a_process(monkeypatch, caplog):
    monkeypatch.setattr(env, "_warned", set())
    monkeypatch.setenv("AGL_LANGCHAIN", "1")
    with caplog.at_level("WARNING", logger="agl.env"):
        assert env.warn_unknown() == [env.unknown_line("AGL_LANGCHAIN", "AGL_LANGCHAIN_INSTRUMENT")]
        assert env.warn_unknown() == []
    assert [r.getMessage() for r in caplog.records] == [env.unknown_line("AGL_LANGCHAIN", "AGL_LANGCHAIN_INSTRUMENT")]


READS = re.compile(r"""(?:environ(?:\.get\(|\[)|setenv\(|\$\{?)["']?(AGL_[A-Z][A-Z0-9_]*)""")
"""A variable read or set by name: ``os.environ.get("AGL_X"``, ``environ["AGL_X"``, ``setenv("AGL_X"``, ``${AGL_X``."""


def test_the_variables_tests_and_setup_scripts_read_are_known():
    """What tests/, scripts/ and the Makefile read is agl's or in ``env.READ_ELSEWHERE``: set, it
    draws no warning. Names a test sets on purpose to be unknown are listed here."""
    deliberately_unknown = {
        "AGL_LANGCHAIN_INSTRUMNT",
        "AGL_OPENAI_AGENT_INSTRUMENT",
        "AGL_LANGCHAIN",
        "AGL_STORE_ULR",
        "AGL_STORE_TOKN",
    }
    paths = [ROOT / "Makefile", *sorted((ROOT / "scripts").glob("*.sh")), *sorted((ROOT / "tests").rglob("*.py"))]
    paths.remove(Path(__file__).resolve())  # its samples are unknown on purpose
    read = {(p.relative_to(ROOT).as_posix(), name) for p in paths for name in READS.findall(p.read_text())}
    assert ("tests/reliability/test_fuzz_servers.py", "AGL_FUZZ_SEED") in read  # the scan sees reads
    assert ("scripts/setup-vllm.sh", "AGL_TORCH_INDEX") in read
    unknown = sorted(f"{path}: {name}" for path, name in read if env.unknown({name: ""}))
    unknown = [line for line in unknown if line.split(": ")[1] not in deliberately_unknown]
    assert not unknown, "add these to env.READ_ELSEWHERE:\n" + "\n".join(unknown)
