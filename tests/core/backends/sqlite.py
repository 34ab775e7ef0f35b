import contextlib

from agl.store.sqlite import SqliteStore


@contextlib.contextmanager
def open_backend(tmp_path):
    store = SqliteStore(tmp_path / "agl.db")
    try:
        yield store
    finally:
        store.close()
