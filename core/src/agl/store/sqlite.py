"""The embedded default store: one SQLite file in WAL mode, nothing to start."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from agl.store.sql import Dialect, SqlStore


class SqliteDialect(Dialect):
    name = "sqlite"
    begin = "BEGIN IMMEDIATE"

    def __init__(self, path: str, busy_timeout_s: float):
        self.path = path
        self.busy_timeout_s = busy_timeout_s

    def connect(self, *, writer: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a crash of the process (SIGKILL); only an OS crash
        # or power loss can take back the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        return conn

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and (
            "locked" in str(exc) or "busy" in str(exc)
        )

    def describe(self) -> str:
        return f"the sqlite store {self.path}"


class SqliteStore(SqlStore):
    """A store in one local SQLite file (``":memory:"`` is not supported: use a temp file).

    A database locked by another connection is waited on for ``busy_timeout_s``,
    then retried ``retries`` times with backoff; after that the call fails with
    :class:`agl.errors.StoreUnavailable`. The defaults ride out about a minute.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = ".agl/agl.db",
        *,
        busy_timeout_s: float = 5.0,
        retries: int = 8,
        retry_delay_s: float = 0.02,
        max_readers: int = 8,
    ):
        path = str(path)
        if path == ":memory:":
            raise ValueError("path: an in-memory SQLite database cannot be shared between threads; use a file")
        if busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s: must be at least 0, got {busy_timeout_s}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        super().__init__(
            SqliteDialect(path, busy_timeout_s), retries=retries, retry_delay_s=retry_delay_s, max_readers=max_readers
        )

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"
