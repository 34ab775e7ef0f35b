"""agl-core's own store schemes, registered like a plugin's (``agl_register_store_schemes``).

The openers are :mod:`agl.store.openers`'; :func:`agl.store.open_store` finds them without
loading installed plugins, and no plugin may register one of these names (see
:mod:`agl.providers`).
"""

from __future__ import annotations

from agl.hookspecs import Register, hookimpl
from agl.store.openers import CORE_SCHEMES, open_http, open_postgres, open_sqlite

__all__ = ["agl_register_store_schemes", "open_http", "open_postgres", "open_sqlite"]


@hookimpl
def agl_register_store_schemes(register: Register) -> None:
    for scheme, (opener, description) in CORE_SCHEMES.items():
        register(scheme, opener, description=description)
