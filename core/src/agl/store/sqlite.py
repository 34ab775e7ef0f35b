"""The embedded default store: one SQLite file in WAL mode, nothing to start.

Commits only append to the write-ahead log (``synchronous=NORMAL``: durable against
a crash of the process, which is what the store promises). Copying the log back
into the database file (a checkpoint, with its two fsyncs) is kept off the commit
path: a background thread checkpoints every ``CHECKPOINT_INTERVAL_S`` while writes
come in, so that little is ever left to copy or to sync, and the writer connection
checkpoints itself only when the log has grown past ``WAL_BACKSTOP_PAGES``, which
lets the log start over from its beginning, so it stays bounded under sustained
writes. Each of the writer's checkpoints pauses writes for its two fsyncs (several
milliseconds), so the backstop is set high enough that this happens rarely (about
every 3,000 rollouts of the W1 benchmark), and the log file is kept at that size
rather than cut back each time (a file that grows again costs more to write).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from agl.errors import ConfigError
from agl.store.sql import Dialect, SqlStore

log = logging.getLogger(__name__)

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
CHECKPOINT_INTERVAL_S = 0.01
"""How often the background thread checkpoints while there are new commits (it waits
up to ``CHECKPOINT_IDLE_S`` between looks while there are none)."""
CHECKPOINT_IDLE_S = 0.25
WAL_BACKSTOP_PAGES = 32768
"""The writer's own ``wal_autocheckpoint``: under sustained writes the log starts over at about 128 MiB."""
WRITER_CACHE_KIB = 256
"""The writer connection's page cache (SQLite's default is 2 MiB). Its inserts append at the right
edge of each table and index (ids are time-ordered), so a few pages are all it revisits; the
default cache filled up anyway, and was a fifth of what capture added to an agent's process."""


class SqliteDialect(Dialect):
    name = "sqlite"
    begin = "BEGIN IMMEDIATE"
    # No AUTOINCREMENT: the store never deletes rows, so a new row's key is still one more
    # than the largest (paging by key stays in insertion order), without the extra page
    # (sqlite_sequence) that AUTOINCREMENT writes in every inserting transaction.
    autoinc_pk = "INTEGER PRIMARY KEY"
    without_rowid = " WITHOUT ROWID"  # attempts: one b-tree instead of a table and its key's index

    def __init__(self, path: str, busy_timeout_s: float):
        self.path = path
        self.busy_timeout_s = busy_timeout_s

    def connect(self, *, writer: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=512,  # multi-row inserts: a statement text per row count (see agl.store.sql.INSERT_ROWS)
        )
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a crash of the process (SIGKILL); only an OS crash
        # or power loss can take back the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        if writer:
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
            conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            # A log that once grew past the backstop is cut back; one within it is reused as it is.
            conn.execute(f"PRAGMA journal_size_limit={(WAL_BACKSTOP_PAGES + 1024) * (4096 + 24)}")
        return conn

    def is_transient(self, exc: BaseException) -> bool:
        # SQLITE_BUSY and SQLITE_LOCKED, with their extended codes (the low byte is the primary code).
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in _BUSY_CODES

    def describe(self) -> str:
        return f"the sqlite store {self.path}"


def _make_parent(path: Path) -> None:
    """Create the store's directory; a clear error where the path cannot hold a database."""
    if path.is_dir():
        raise ConfigError(f"path: {path} is a directory; name a file in it, e.g. {path / 'agl.db'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"path: cannot create the directory {path.parent}: a file is in the way") from None
    except PermissionError as exc:
        raise ConfigError(f"path: cannot create the directory {path.parent}: {exc.strerror}") from None


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
        _make_parent(Path(path))
        self.path = path
        self._commits = 0
        try:
            super().__init__(
                SqliteDialect(path, busy_timeout_s),
                retries=retries,
                retry_delay_s=retry_delay_s,
                max_readers=max_readers,
            )
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc) or "unable to open" in str(exc):
                raise ConfigError(f"path: {path} cannot be opened as a SQLite database ({exc})") from None
            raise
        self._stop_checkpoints = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="agl-sqlite-checkpoint", daemon=True)
        self._checkpointer.start()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    def _committed(self, jobs: int) -> None:
        self._commits += 1

    def _checkpoint_loop(self) -> None:
        conn = None
        seen = self._commits
        wait = CHECKPOINT_INTERVAL_S
        try:
            while not self._stop_checkpoints.wait(wait):
                if self._commits == seen:
                    wait = min(wait * 2, CHECKPOINT_IDLE_S)
                    continue
                seen = self._commits
                wait = CHECKPOINT_INTERVAL_S
                try:
                    if conn is None:
                        conn = self.dialect.connect(writer=False)
                    # PASSIVE never waits for readers or the writer; what it cannot copy now
                    # it copies next time.
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # the next round (or the writer's backstop) catches up
                    log.debug("%s: background checkpoint failed: %s", self.dialect.describe(), exc)
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        self._stop_checkpoints.set()
        if self._checkpointer.is_alive() and self._checkpointer is not threading.current_thread():
            self._checkpointer.join()
        super().close()
