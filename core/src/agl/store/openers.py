"""agl-core's own store openers, one per URL scheme, and :func:`open_store` calling them directly.

These schemes are fixed (no plugin may register one of their names, see :mod:`agl.providers`),
so :func:`open_store` (``agl.open_store``, ``agl.store.open_store``, and the capture writer's)
opens them without loading the plugin registry and pluggy, which an agent's process has no
other use for; any other scheme goes to :func:`agl.store.base.open_store`, which looks the
opener up among the plugins. :mod:`agl.store.schemes` registers the same openers as a
built-in plugin, so ``agl plugins`` lists them with everyone else's.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from agl.env import STORE_URL
from agl.errors import ConfigError
from agl.store import base
from agl.store.base import Store, sqlite_path, store_url_scheme


def open_sqlite(url: str, *, create: bool = True, **options) -> Store:
    """Embedded SQLite; with ``create=False`` a file that does not exist is a ConfigError."""
    from agl.store.sqlite import SqliteStore

    path = sqlite_path(url)
    if not create and not path.is_file():
        raise ConfigError(
            f"no such store: {path} (nothing has written to it yet: give the store with --store URL "
            f"or ${STORE_URL}; agl train, agl run and agl store serve create it)"
        )
    return SqliteStore(path, **options)


def open_http(url: str, **options) -> Store:
    """A store server (``agl store serve``) over HTTP."""
    from agl.store.http import HttpStore

    return HttpStore(url, **options)


def open_postgres(url: str, **options) -> Store:
    """PostgreSQL."""
    from agl.store.postgres import PostgresStore

    return PostgresStore(url, **options)


CORE_SCHEMES: dict[str, tuple[Callable[..., Store], str]] = {
    "sqlite": (open_sqlite, "embedded SQLite file"),
    "http": (open_http, "a store server (agl store serve)"),
    "https": (open_http, "a store server behind TLS"),
    "postgresql": (open_postgres, "PostgreSQL"),
    "postgres": (open_postgres, "PostgreSQL"),
}
"""Each scheme agl-core opens itself: its opener and the description ``agl plugins`` shows."""


def open_store(url: str | os.PathLike[str] | None = None, *, create: bool = True, **options) -> Store:
    """:func:`agl.store.base.open_store` (the same URLs, options and errors), with agl-core's own
    schemes opened here rather than looked up in the plugin registry."""
    url, scheme = store_url_scheme(url)
    core = CORE_SCHEMES.get(scheme)
    if core is None:
        return base.open_store(url, create=create, **options)
    return core[0](url, **({"create": create} if scheme == "sqlite" else {}), **options)
