"""MkDocs hooks (``hooks:`` in mkdocs.yml): add the reference pages generated from the code.

The pages exist only in the build (nothing generated is committed), so they are made from
the code being documented each time the site is built and cannot drift from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from agl_docs.pages import GENERATED  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import File, Files  # noqa: E402


def on_files(files: Files, config) -> Files:
    """Add each generated page; a committed file at the same path is an error (it would be shadowed)."""
    for path, make in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/{path} is generated at build time (agl_docs.pages): delete the committed file")
        files.append(File.generated(config, path, content=make()))
    return files
