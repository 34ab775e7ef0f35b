"""No import circles in agl's packages: core/, trainer/, integrations/ and plugins/.

The graph is read statically with ``ast`` from every module under each package's ``src``.
An edge ``a -> b`` is any import of module ``b`` written in module ``a``:

- module-level imports, function-level (deferred) imports, and imports under
  ``if TYPE_CHECKING:`` all count: a deferred import hides a circle from Python at
  start-up, not from a reader, and a type-only one still ties the two modules together;
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``;
  relative imports are resolved against the importing module;
- left out: the block under ``if __name__ == "__main__":`` (it runs only when the file is a
  script, as the module ``__main__``, which nothing imports), and the parent packages Python
  runs before a submodule (``import a.b.c`` is an edge to ``a.b.c``, not to ``a`` and ``a.b``:
  a package's ``__init__`` re-exporting its submodules would otherwise put every one of them
  in a circle with it).

A circle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "core" / "src", ROOT / "trainer" / "src", *sorted(ROOT.glob("integrations/*/src"))]
SOURCES += sorted(ROOT.glob("plugins/*/src"))

KNOWN: list[frozenset[str]] = []
"""Circles that exist and are being removed elsewhere; each must still be a circle (so the entry goes with it)."""


def modules(sources: Iterable[Path]) -> dict[str, Path]:
    """Every module under the ``src`` folders, by dotted name (a package by its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for src in sources:
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts:
                found[".".join(parts)] = path
    return found


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if __name__ == "__main__":``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"':
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _imported_modules(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict[str, Path]):
    """The modules of ``known`` one import statement names: per name, the module itself, or the nearest package."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        candidates = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
    for name in candidates:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            yield name


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``module`` (the file ``path``) imports anywhere in its code."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _skipped_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            found.update(_imported_modules(module, path.name == "__init__.py", node, known))
    found.discard(module)
    return found


def import_graph(sources: Iterable[Path]) -> dict[str, set[str]]:
    """``{module: modules it imports}`` for every module under ``sources``."""
    known = modules(sources)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_the_packages_have_no_import_circle():
    graph = import_graph(SOURCES)
    assert len(graph) > 150 and {"agl.plugins", "agl_trainer.trainer", "agl_otel", "agl_verl.cli"} <= set(graph)
    found = circles(graph)
    unexpected = [sorted(c) for c in found if c not in KNOWN]
    assert unexpected == [], f"import circles: {unexpected}"
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert gone == [], f"no longer circles, remove them from KNOWN: {gone}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


@pytest.mark.parametrize(
    "b_imports_a",
    [
        "import pkg.a\n",
        "def later():\n    from pkg import a\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import Thing\n",
        "from . import a\n",
        "from .a import Thing\n",
    ],
    ids=["module level", "function level", "type checking", "relative module", "relative name"],
)
def test_a_circle_is_found_however_the_import_is_written(tmp_path, b_imports_a):
    src = _package(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import f\nThing = 1\n", "pkg/b.py": b_imports_a}
    )
    assert circles(import_graph([src])) == [frozenset({"pkg.a", "pkg.b"})]


def test_a_script_block_and_a_package_init_make_no_circle(tmp_path):
    src = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import Thing\n",
            "pkg/a.py": "import pkg.b\nThing = 1\n",
            "pkg/b.py": "x = 1\nif __name__ == '__main__':\n    from pkg.a import Thing\n",
        },
    )
    graph = import_graph([src])
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert circles(graph) == []
