"""agl-core's own store schemes, registered like a plugin's (``agl_register_store_schemes``).

:func:`agl.store.open_store` finds them without loading installed plugins, and no
plugin may register one of these names (see :mod:`agl.providers`).
"""

from __future__ import annotations

from agl.env import STORE_URL
from agl.errors import ConfigError
from agl.hookspecs import Register, hookimpl
from agl.store.base import Store, sqlite_path


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


@hookimpl
def agl_register_store_schemes(register: Register) -> None:
    register("sqlite", open_sqlite, description="embedded SQLite file")
    register("http", open_http, description="a store server (agl store serve)")
    register("https", open_http, description="a store server behind TLS")
    register("postgresql", open_postgres, description="PostgreSQL")
    register("postgres", open_postgres, description="PostgreSQL")
