"""The store on PostgreSQL, for many writers on many machines.

It is the shared :class:`~agl.store.sql.SqlStore` with a psycopg 3 dialect. Every
connection runs in autocommit mode: writes open their own transaction (one per
group commit) and reads are single statements, so no connection ever sits idle
inside a transaction. Claims select rows with ``FOR UPDATE SKIP LOCKED``, so any
number of processes on any number of machines can claim at once and no rollout is
ever handed out twice.

Serialization failures, deadlocks, dropped connections and a server that is
restarting are retried (reconnecting where the connection died); after the retry
budget the call fails with :class:`agl.errors.StoreUnavailable`.

Needs the ``postgres`` extra: ``pip install 'agl-core[postgres]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agl.errors import ConfigError
from agl.store.sql import Dialect, SqlStore

# SQLSTATE classes and codes worth retrying: connection exceptions (08), transaction
# rollbacks such as serialization failures and deadlocks (40), insufficient resources
# such as too many connections (53), an administrator shutdown or a server still
# starting (57P01-57P03) and a lock that could not be had (55P03).
_TRANSIENT_CLASSES = ("08", "40", "53")
_TRANSIENT_CODES = frozenset({"57P01", "57P02", "57P03", "55P03"})
_SCHEMA_LOCK_KEY = 7_361_150_001  # any constant: serializes schema creation across processes


def _psycopg():
    try:
        import psycopg
    except ImportError as exc:  # an optional dependency of agl-core
        raise ConfigError(
            "url: a postgresql:// store needs psycopg 3; install it with pip install 'agl-core[postgres]'"
        ) from exc
    return psycopg


class PostgresDialect(Dialect):
    """psycopg 3 against PostgreSQL 12 or later."""

    name = "postgresql"
    placeholder = "%s"
    autoinc_pk = "BIGSERIAL PRIMARY KEY"
    blob = "BYTEA"
    real = "DOUBLE PRECISION"
    bigint = "BIGINT"
    skip_locked = "FOR UPDATE SKIP LOCKED"
    for_update = " FOR UPDATE"
    begin = "BEGIN"
    schema_lock = f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})"

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, application_name: str = "agl"):
        self.psycopg = _psycopg()
        try:
            info = self.psycopg.conninfo.conninfo_to_dict(url)
        except self.psycopg.ProgrammingError as exc:
            raise ConfigError(f"url: not a valid PostgreSQL connection URL: {exc}") from exc
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self.application_name = application_name
        host = info.get("host") or "localhost"
        port = info.get("port") or "5432"
        self._where = f"{host}:{port}/{info.get('dbname') or info.get('user') or ''}"

    def connect(self, *, writer: bool) -> Any:
        return self.psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(self.connect_timeout_s)),
            application_name=f"{self.application_name}-{'writer' if writer else 'reader'}",
        )

    def is_transient(self, exc: BaseException) -> bool:
        if not isinstance(exc, self.psycopg.Error):
            return False
        state = getattr(exc, "sqlstate", None)
        if state is None:
            # No SQLSTATE: the connection could not be made or was lost mid-statement.
            return isinstance(exc, self.psycopg.OperationalError)
        return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES

    def is_broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def describe(self) -> str:
        return f"the postgresql store at {self._where}"

    def json_field(self, column: str, path: Sequence[str], cast: str | None = None) -> str:
        # #>> gives what json_extract gives (a string unquoted, null as NULL, anything else as
        # JSON text), except numbers, which come as text: hence the cast.
        keys = ",".join(f'"{key}"' for key in path)
        expr = f"({column}::json #>> '{{{keys}}}')"
        return f"{expr}::{cast}" if cast else expr


class PostgresStore(SqlStore):
    """A store in a PostgreSQL database, shared by runners on many machines.

    ``url`` is a libpq URL (``postgresql://user:password@host:5432/dbname``); the
    database must exist, the tables are created on first use. ``retries`` and
    ``retry_delay_s`` set the retry budget for transient failures, ``max_readers``
    the reader connections per store (plus one writer connection), and
    ``connect_timeout_s`` how long one connection attempt may take.
    """

    def __init__(
        self,
        url: str,
        *,
        retries: int = 8,
        retry_delay_s: float = 0.02,
        max_readers: int = 4,
        connect_timeout_s: float = 10.0,
        application_name: str = "agl",
    ):
        self.url = url
        dialect = PostgresDialect(url, connect_timeout_s=connect_timeout_s, application_name=application_name)
        super().__init__(dialect, retries=retries, retry_delay_s=retry_delay_s, max_readers=max_readers)

    def __repr__(self) -> str:
        return f"PostgresStore({self.dialect.describe()!r})"
