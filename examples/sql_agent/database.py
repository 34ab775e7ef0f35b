"""Read-only access to the Chinook database, with a time limit and a row cap on every query.

The database file is never written: it is opened with ``mode=ro`` and SQLite refuses
any statement that would change it. A query past its deadline is interrupted through
the progress handler, so a runaway cross join or recursive CTE costs at most
``timeout_s``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

DB_ENV = "SQL_AGENT_DB"
"""Environment variable that overrides where Chinook.db is."""

DEFAULT_DB = Path(__file__).resolve().parent / "data" / "chinook" / "Chinook.db"
"""The bundled copy of the database (MIT licence and provenance beside it)."""

TIMEOUT_S = 2.0
MAX_ROWS = 1000


def db_path(path: str | os.PathLike | None = None) -> Path:
    """The database file: ``path``, else ``$SQL_AGENT_DB``, else the bundled ``data/chinook/Chinook.db``."""
    chosen = Path(path or os.environ.get(DB_ENV) or DEFAULT_DB).resolve()
    if not chosen.is_file():
        raise FileNotFoundError(f"Chinook database not found at {chosen} (set ${DB_ENV} or pass --db)")
    return chosen


def connect(path: str | os.PathLike | None = None) -> sqlite3.Connection:
    """A read-only connection (``file:...?mode=ro``) usable from any thread."""
    return sqlite3.connect(f"file:{db_path(path)}?mode=ro", uri=True, check_same_thread=False)


@dataclass
class QueryResult:
    """Rows of a query that ran, or the reason it did not."""

    rows: list[tuple] | None = None
    error: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the query ran to the end within its limits."""
        return self.error is None


class QueryTimeout(Exception):
    """A query ran past its deadline."""


def run_query(
    sql: str,
    *,
    path: str | os.PathLike | None = None,
    timeout_s: float = TIMEOUT_S,
    max_rows: int = MAX_ROWS,
) -> QueryResult:
    """Run one statement read-only; never raises for a bad, failing or slow query.

    At most ``max_rows`` rows are fetched (``truncated`` says when there were more).
    """
    if not sql or not sql.strip():
        return QueryResult(error="empty query")
    deadline = time.monotonic() + timeout_s
    try:
        conn = connect(path)
    except (OSError, sqlite3.Error) as exc:
        return QueryResult(error=f"cannot open the database: {exc}")
    conn.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
        truncated = len(rows) > max_rows
        return QueryResult(rows=rows[:max_rows], truncated=truncated)
    except sqlite3.OperationalError as exc:
        if time.monotonic() > deadline or "interrupted" in str(exc):
            return QueryResult(error=f"timed out after {timeout_s:g}s")
        return QueryResult(error=f"{type(exc).__name__}: {exc}")
    except (sqlite3.Error, ValueError, OverflowError, MemoryError) as exc:
        # ValueError: e.g. a NUL character in the text; sqlite3.Warning: several statements.
        return QueryResult(error=f"{type(exc).__name__}: {exc}")
    except sqlite3.Warning as exc:
        return QueryResult(error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
