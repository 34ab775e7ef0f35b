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


class SqliteStore(SqlStore):
    """A store in one local SQLite file (``":memory:"`` is not supported: use a temp file)."""

    def __init__(self, path: str | os.PathLike[str] = ".agl/agl.db", *, busy_timeout_s: float = 5.0):
        path = str(path)
        if path == ":memory:":
            raise ValueError("path: an in-memory SQLite database cannot be shared between threads; use a file")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        super().__init__(SqliteDialect(path, busy_timeout_s))

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"
