"""The PostgreSQL backend: a fresh database per test on one server per test session.

The server (tests/pg.py) starts on first use and stops at interpreter exit.
"""

import contextlib

from agl.store.postgres import PostgresStore
from tests.pg import create_database, drop_database, shared_server_url


@contextlib.contextmanager
def open_backend(tmp_path):
    url = create_database(shared_server_url())
    store = PostgresStore(url)
    try:
        yield store
    finally:
        store.close()
        drop_database(url)
