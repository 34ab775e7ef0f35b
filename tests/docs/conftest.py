"""The documentation's tests import the site's machinery (``docs/_hooks/agl_docs``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "_hooks"

if str(HOOKS) not in sys.path:
    sys.path.insert(0, str(HOOKS))
