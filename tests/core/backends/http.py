"""The HTTP store: a real server (uvicorn on 127.0.0.1, a free port, a random token)
over a SqliteStore in ``tmp_path``, and the client that batches."""

import contextlib

from agl.credentials import new_token
from agl.store.http import HttpStore
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread


@contextlib.contextmanager
def open_backend(tmp_path, **client_options):
    backing = SqliteStore(tmp_path / "agl-http.db")
    token = new_token(16)
    try:
        with ServerThread(backing, token=token) as server:
            client = HttpStore(server.url, token=token, **client_options)
            try:
                yield client
            finally:
                client.close()
    finally:
        backing.close()
