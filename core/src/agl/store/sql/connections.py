"""A SQL store's connections: the pool of reader connections, the writer's connection, retries
of transient failures, and the reads (one statement, or a query paged by primary key)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from agl.errors import StoreUnavailable, Transient
from agl.retry import Attempts, RetryPolicy
from agl.store.sql.dialect import Dialect

log = logging.getLogger("agl.store.sql")

PAGE_SIZE = 500
"""Rows a streamed query reads per statement."""
BULK = 500
"""Ids in one ``IN (...)`` list at most."""


class ReaderPool:
    """At most ``size`` reader connections, shared by every thread of the store.

    A read takes a connection for one statement (one page of a streamed query) and
    gives it back, so a thousand threads streaming results need only ``size``
    connections, and no read holds a connection between pages.
    """

    def __init__(self, connect: Callable[[], Any], size: int):
        self._connect = connect
        self._idle: list[Any] = []
        self._count = 0
        self._size = size
        self._cond = threading.Condition()

    def acquire(self) -> Any:
        with self._cond:
            while not self._idle and self._count >= self._size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def release(self, conn: Any, *, broken: bool = False) -> None:
        with self._cond:
            if broken:
                self._count -= 1
            else:
                self._idle.append(conn)
            self._cond.notify()
        if broken:
            close_quietly(conn)

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
        for conn in idle:
            close_quietly(conn)


class DatabaseTransient(Transient):
    """A driver error the dialect calls transient (its ``__cause__``), as the type :mod:`agl.retry` retries."""


def close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a dead connection; nothing left to save
        conn.close()


class Connections:
    """The connection half of :class:`~agl.store.sql.SqlStore` (a mixin: the store sets ``dialect``,
    ``retries``, ``retry_delay_s``, ``max_wait_s``, ``_pool`` and ``_writer_conn``)."""

    dialect: Dialect
    retries: int
    retry_delay_s: float
    max_wait_s: float | None
    _pool: ReaderPool
    _writer_conn: Any

    def _sql(self, text: str) -> str:
        return text if self.dialect.placeholder == "?" else text.replace("?", self.dialect.placeholder)

    def _with_retries(
        self,
        fn: Callable[[], Any],
        on_transient: Callable[[BaseException], None] | None = None,
        started: float | None = None,
    ) -> Any:
        """``fn()``, retried on transient errors; ``max_wait_s`` counts from ``started`` (now)."""

        def once() -> Any:
            try:
                return fn()
            except Exception as exc:
                if not self.dialect.is_transient(exc):
                    raise
                if on_transient is not None:
                    on_transient(exc)
                raise DatabaseTransient(f"{type(exc).__name__}: {exc}") from exc

        def on_retry(exc: BaseException, wait: float) -> None:
            log.warning("%s: transient error (%s); retrying in %.2fs", self.dialect.describe(), exc.__cause__, wait)

        def give_up(exc: BaseException, attempts: Attempts) -> StoreUnavailable:
            return StoreUnavailable(
                f"{self.dialect.describe()} is still unavailable after {attempts.failures - 1} retries "
                f"over {attempts.elapsed_s:.1f}s: {exc}"
            )

        policy = RetryPolicy(
            max_attempts=self.retries + 1,
            deadline_s=self.max_wait_s,
            first_delay_s=self.retry_delay_s,
            retry_on=(DatabaseTransient,),
        )
        return policy.call(once, on_retry=on_retry, give_up=give_up, started=started)

    def _writer_connection(self) -> Any:
        if self._writer_conn is None:
            self._writer_conn = self.dialect.connect(writer=True)
        return self._writer_conn

    def _drop_broken_writer(self, exc: BaseException) -> None:
        if self._writer_conn is not None and self.dialect.is_broken(self._writer_conn):
            close_quietly(self._writer_conn)
            self._writer_conn = None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one query and return all its rows; the connection goes back to the pool at once."""
        text = self._sql(sql)

        def run():
            conn = self._pool.acquire()
            try:
                cur = conn.cursor()
                cur.execute(text, tuple(params))
                rows = cur.fetchall()
                self._end_read(conn)
            except BaseException:
                self._pool.release(conn, broken=self.dialect.is_broken(conn))
                raise
            self._pool.release(conn)
            return rows

        return self._with_retries(run)

    def _end_read(self, conn) -> None:
        """End the read's transaction where the driver opened one (autocommit readers need nothing)."""

    def _paged(self, table: str, columns: str, where: list[str], params: list[Any]) -> Iterator[Any]:
        last = 0
        while True:
            clauses = " AND ".join(where + ["pk > ?"])
            rows = self._read(
                f"SELECT pk, {columns} FROM {table} WHERE {clauses} ORDER BY pk LIMIT {PAGE_SIZE}",
                [*params, last],
            )
            for row in rows:
                yield row[1:]
            if len(rows) < PAGE_SIZE:
                return
            last = rows[-1][0]

    @staticmethod
    def _in(column: str, values: Sequence[Any], where: list[str], params: list[Any]) -> None:
        where.append(f"{column} IN ({', '.join('?' for _ in values)})" if values else "1 = 0")
        params.extend(values)

    @staticmethod
    def _where_given(where: list[str], params: list[Any], *conditions: tuple[str, Any]) -> None:
        """Add each ``(condition, value)`` whose value is not None (a condition with one ``?``)."""
        for condition, value in conditions:
            if value is not None:
                where.append(condition)
                params.append(value)

    def _filter_rollout(self, where, params, rollout_id, rollout_ids, production) -> None:
        if production:
            where.append("rollout_id IS NULL")
        self._where_given(where, params, ("rollout_id = ?", rollout_id))
        if rollout_ids is not None:
            self._in("rollout_id", list(rollout_ids), where, params)

    def _read_in(self, head: str, column: str, ids: Sequence[str], tail: str = "") -> list[Any]:
        """All rows of ``{head} {column} IN (ids){tail}``, one statement per 500 ids."""
        ids = list(ids)
        rows: list[Any] = []
        for i in range(0, len(ids), BULK):
            part = ids[i : i + BULK]
            rows.extend(self._read(f"{head} {column} IN ({', '.join('?' for _ in part)}){tail}", part))
        return rows
