"""The store on a SQL database, shared by the SQLite and PostgreSQL backends.

Writes are committed in groups on one writer connection per store: every caller
waiting at the same moment shares one transaction. There is no writer thread:
the first caller to find the writer free leads, running its own write and
whatever else is queued, and hands the lead to the next waiting caller when its
own write has committed, so a lone caller never waits on another thread. A group
runs without savepoints; if one caller's write fails, the group is rolled back
and run again with each write in its own savepoint, so one caller's bad input
fails only that caller. Within a group, inserts into one table go in multi-row
statements, and claims and finishes in one merged statement each
(:mod:`agl.store.claims`). A write returns once its transaction has committed, so
whatever was acknowledged survives a SIGKILL of the process. Reads use per-thread connections and page through
results by primary key, so a query over millions of rows holds one page at a time.

A backend supplies a :class:`Dialect`: how to connect, its column types, its
placeholder and how it locks rows for a claim.
"""

from __future__ import annotations

import _thread
import abc
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Unpack

from pydantic import BaseModel

from agl.errors import IdConflict, IncompatibleStore, InvalidTransition, NotFound, StoreUnavailable, Transient
from agl.retry import Attempts, RetryPolicy
from agl.schema import (
    INT64_MAX,
    ROLLOUT_REWARD_ID,
    Attempt,
    LLMCall,
    ModelVersion,
    Reward,
    Rollout,
    RolloutStatus,
    Span,
    StoreStats,
    Task,
    check_json,
    new_id,
    now,
)
from agl.store.base import FinishOptions, Store, step_record_row, with_defaults
from agl.store.claims import Claim, Finish, RolloutQueue
from agl.tokens import STORED, float32_array, int32_array, to_bytes

log = logging.getLogger(__name__)

PAGE_SIZE = 500
MAX_GROUP = 256
INSERT_ROWS = 64
"""Rows in one multi-row INSERT statement at most (and so distinct statement texts per table)."""
TASK_CACHE_BYTES = 8 * 1024 * 1024
"""Task bodies a store keeps in memory for claims (tasks never change once stored)."""
_OWNED_IDS = {"spans": "span_id", "llm_calls": "call_id", "rewards": "reward_id"}
"""The tables whose ids belong to their rollout (:class:`~agl.errors.IdConflict`), and each one's id column."""


class Dialect(abc.ABC):
    """What differs between SQL databases. Subclasses fill in the blanks."""

    name = "sql"
    placeholder = "?"
    autoinc_pk = "INTEGER PRIMARY KEY AUTOINCREMENT"
    blob = "BLOB"
    real = "REAL"
    bigint = "INTEGER"
    skip_locked = ""  # appended to the claim's row selection
    for_update = ""  # appended to selections of rows that the transaction then changes
    begin = "BEGIN"
    schema_lock: str | None = None  # run before creating the schema, so concurrent creators queue
    without_rowid = ""  # appended to tables keyed by their primary key alone, where the database can store them so

    @abc.abstractmethod
    def connect(self, *, writer: bool) -> Any:
        """A new connection to the database (autocommit: transactions are explicit)."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether an error is worth retrying (a lock, a dropped connection)."""
        return False

    def is_broken(self, conn: Any) -> bool:
        """Whether a connection is unusable after an error and must be replaced."""
        return False

    def describe(self) -> str:
        """Where the database is, for error messages (never a password)."""
        return f"the {self.name} store"

    def json_field(self, column: str, path: Sequence[str], cast: str | None = None) -> str:
        """SQL for the value at ``path`` (object keys) in the JSON text of ``column``.

        The value comes as SQLite's ``json_extract`` gives it: a JSON string as the
        string, null as NULL, any other value as its JSON text, a number as a number
        (``cast``, the column type to convert it to, is for databases that give it as
        text). This default is SQLite's.
        """
        keys = "".join(f".{key}" if key.isidentifier() else f'."{key}"' for key in path)
        return f"json_extract({column}, '${keys}')"


_ROLLOUT_COLUMNS = (
    "rollout_id",
    "task_id",
    "status",
    "attempt",
    "max_attempts",
    "timeout_s",
    "model_version",
    "step",
    "mode",
    "runner_id",
    "claim_id",
    "created_at",
    "started_at",
    "heartbeat_at",
    "ended_at",
    "error",
    "output",
    "max_response_tokens",
    "seed",
    "resources",
    "resources_version",
)
_ROLLOUT_SELECT = ", ".join(_ROLLOUT_COLUMNS)
_NULL = "null"  # the JSON text of None, what an output column holds for no output


def _schema(d: Dialect) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS tasks (
            pk {d.autoinc_pk}, task_id TEXT NOT NULL UNIQUE, split TEXT NOT NULL, body TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS tasks_split ON tasks (split, pk)",
        f"""CREATE TABLE IF NOT EXISTS rollouts (
            pk {d.autoinc_pk}, rollout_id TEXT NOT NULL UNIQUE, task_id TEXT NOT NULL,
            status TEXT NOT NULL, attempt {d.bigint} NOT NULL, max_attempts {d.bigint} NOT NULL,
            timeout_s {d.real}, model_version TEXT, step {d.bigint}, mode TEXT NOT NULL,
            runner_id TEXT, claim_id TEXT, created_at {d.real} NOT NULL, started_at {d.real},
            heartbeat_at {d.real}, ended_at {d.real}, error TEXT, output TEXT,
            max_response_tokens {d.bigint}, seed {d.bigint}, resources TEXT, resources_version TEXT)""",
        "CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts (status, pk)",
        "CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts (task_id)",
        # Only running rollouts have a claim id: the others stay out of the index.
        "CREATE INDEX IF NOT EXISTS rollouts_claim ON rollouts (claim_id) WHERE claim_id IS NOT NULL",
        f"""CREATE TABLE IF NOT EXISTS attempts (
            rollout_id TEXT NOT NULL, attempt {d.bigint} NOT NULL, runner_id TEXT, status TEXT NOT NULL,
            started_at {d.real} NOT NULL, ended_at {d.real}, error TEXT, heartbeat_at {d.real},
            PRIMARY KEY (rollout_id, attempt)){d.without_rowid}""",
        f"""CREATE TABLE IF NOT EXISTS spans (
            pk {d.autoinc_pk}, span_id TEXT NOT NULL UNIQUE, rollout_id TEXT, kind TEXT NOT NULL,
            start_time {d.real} NOT NULL, body TEXT NOT NULL,
            seq {d.bigint} NOT NULL, end_time {d.real}, response_id TEXT, agent TEXT)""",
        "CREATE INDEX IF NOT EXISTS spans_rollout ON spans (rollout_id, pk)",
        f"""CREATE TABLE IF NOT EXISTS llm_calls (
            pk {d.autoinc_pk}, call_id TEXT NOT NULL UNIQUE, rollout_id TEXT, body TEXT NOT NULL,
            prompt_ids {d.blob} NOT NULL, response_ids {d.blob} NOT NULL, response_logprobs {d.blob},
            seq {d.bigint} NOT NULL, created_at {d.real} NOT NULL, model_version TEXT)""",
        "CREATE INDEX IF NOT EXISTS llm_calls_rollout ON llm_calls (rollout_id, pk)",
        f"""CREATE TABLE IF NOT EXISTS rewards (
            pk {d.autoinc_pk}, reward_id TEXT NOT NULL UNIQUE, rollout_id TEXT, body TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS rewards_rollout ON rewards (rollout_id, pk)",
        f"""CREATE TABLE IF NOT EXISTS model_versions (
            pk {d.autoinc_pk}, version TEXT NOT NULL UNIQUE, body TEXT NOT NULL)""",
        # The trainer's step records (metrics.jsonl's lines), for the dashboard's runs page.
        f"""CREATE TABLE IF NOT EXISTS run_steps (
            pk {d.autoinc_pk}, run_id TEXT NOT NULL, kind TEXT NOT NULL, step {d.bigint} NOT NULL,
            created_at {d.real} NOT NULL, body TEXT NOT NULL, UNIQUE (run_id, kind, step))""",
    ]


_LATER_INDEXES = (
    # The dashboard's rollout list filters by these; made once the tables are known to have the columns.
    "CREATE INDEX IF NOT EXISTS rollouts_step ON rollouts (step, pk)",
    "CREATE INDEX IF NOT EXISTS rollouts_mode ON rollouts (mode, pk)",
    "CREATE INDEX IF NOT EXISTS spans_agent ON spans (agent, rollout_id) WHERE agent IS NOT NULL",
)


def _added_columns(d: Dialect) -> list[tuple[str, str, str]]:
    """Columns added after a table was first released: ``(table, column, type)``, added to
    an older database when it is opened (a nullable column, so its rows stay as they were)."""
    return [
        ("rollouts", "max_response_tokens", d.bigint),
        ("rollouts", "seed", d.bigint),
        ("attempts", "heartbeat_at", d.real),
        ("rollouts", "reward", d.real),
        ("llm_calls", "behaviour_logprobs", d.blob),
        ("llm_calls", "policy", "TEXT"),
        ("rollouts", "resources", "TEXT"),
        ("rollouts", "resources_version", "TEXT"),
    ]


def _final_reward_sql(d: Dialect) -> str:
    """SQL for a rollout's (``rollouts`` row's) final reward: its returned ``reward``, else its
    last stored ``reward`` (:func:`agl_trainer.transitions.rewards.final_reward` without plugins)."""
    f = d.json_field
    return (
        f"(SELECT {f('w.body', ['value'], d.real)} FROM rewards w WHERE w.rollout_id = rollouts.rollout_id "
        f"AND {f('w.body', ['name'])} = 'reward' "
        f"ORDER BY CASE WHEN {f('w.body', ['source'])} = 'return' THEN 1 ELSE 0 END DESC, w.pk DESC LIMIT 1)"
    )


# Columns that copy a few fields of a table's JSON body (the body stays the record), so that
# building transitions reads them as columns rather than extracting them from the JSON.
_FIELD_COLUMNS = {
    "spans": ("seq", "end_time", "response_id", "agent"),
    "llm_calls": ("seq", "created_at", "model_version", "policy"),
}


def _attr_text(value: Any) -> str | None:
    """A span attribute as its text column holds it: a string as it is, None as NULL,
    a structure as its JSON text, anything else as ``str`` gives it."""
    if value is None or value.__class__ is str:
        return value
    if isinstance(value, (dict, list)):
        return _dumps(value)
    return str(value)


_TOKEN_FIELDS = frozenset({"prompt_ids", "response_ids", "response_logprobs", "behaviour_logprobs"})
_TOKEN_EXCLUDE = set(_TOKEN_FIELDS)  # pydantic takes a set as it is (a frozenset it converts on every call)


def _body(model: BaseModel, exclude: set[str] | None = None) -> str:
    """``model.model_dump_json(exclude=exclude)``, without its per-call wrapper (the same text)."""
    return model.__pydantic_serializer__.to_json(model, exclude=exclude).decode()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def _rollout_from_row(row: Sequence[Any]) -> Rollout:
    data = dict(zip(_ROLLOUT_COLUMNS, row, strict=False))
    data["output"] = None if data["output"] is None else json.loads(data["output"])
    data["resources"] = json.loads(data["resources"]) if data["resources"] else {}
    return Rollout.model_validate(data, context=STORED)


class TransitionRows(NamedTuple):
    """Raw rows of some rollouts' records, what building transitions reads (see :meth:`SqlStore.transition_rows`).

    Each list is grouped by rollout, each rollout's records in the order they were stored.
    """

    calls: list[tuple]
    """``(rollout_id, call_id, seq, created_at, model_version, prompt_ids, response_ids, response_logprobs,
    behaviour_logprobs, policy)``: the token columns as stored, little-endian int32 / float32 bytes (either
    logprob column may be None)."""
    spans: list[tuple]
    """LLM spans (kind ``llm``) only: ``(rollout_id, span_id, seq, start_time, end_time,
    attributes["gen_ai.response.id"], attributes["gen_ai.agent.name"])``."""
    rewards: list[tuple]
    """``(rollout_id, reward_id, name, value, source, created_at)``."""


class _Insert:
    """A write that only inserts rows into one table, ignoring ids already stored.

    Calling it inserts its rows on a cursor (how a job runs alone). A group commit
    runs the inserts of all its jobs first, the rows of each table together in
    multi-row statements: jobs in one group were queued concurrently, so running
    their inserts before their other writes is one of the orders they could have
    run in, and inserts of different tables do not depend on each other.
    """

    __slots__ = ("columns", "rows", "store", "table")

    def __init__(self, store: SqlStore, table: str, columns: Sequence[str], rows: list[tuple]):
        self.store = store
        self.table = table
        self.columns = tuple(columns)
        self.rows = rows

    def __call__(self, cur) -> None:
        self.store._insert_ignore(cur, self.table, self.columns, self.rows)


class _QueueJob:
    """A claim or a finish as a write: run alone on a cursor, or merged with the group's other
    claims or finishes (see :mod:`agl.store.claims`)."""

    __slots__ = ("op", "store")

    def __init__(self, store: SqlStore, op: Claim | Finish):
        self.store = store
        self.op = op


class _ClaimJob(_QueueJob):
    __slots__ = ()

    def __call__(self, cur):
        store = self.store
        return store._with_tasks(cur, store._queue.claim(cur, self.op, now()))


class _FinishJob(_QueueJob):
    __slots__ = ()

    def __call__(self, cur):
        return self.store._queue.finish(cur, self.op, now())


class _Job:
    """One caller's write: the function to run in the group's transaction and its outcome.

    ``lock`` is held from creation; the caller blocks on it and is woken exactly
    once: when a leader has settled the job, or when it is made the leader itself.
    """

    __slots__ = ("abandoned", "created", "done", "fn", "lead", "lock", "ok", "value")

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn
        self.created = time.monotonic()  # a caller's wait for a locked database counts from here
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.done = False
        self.ok = False
        self.value: Any = None
        self.lead = False  # this job's caller is (or was made) the leader: settling must not wake it
        self.abandoned = False  # its caller stopped waiting (interrupted): never hand it the lead

    def settle(self, ok: bool, value: Any) -> None:
        self.ok = ok
        self.value = value
        self.done = True
        if not self.lead:
            self.lock.release()

    def outcome(self) -> Any:
        if self.ok:
            return self.value
        raise self.value


class _ReaderPool:
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
            _close_quietly(conn)

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
        for conn in idle:
            _close_quietly(conn)


class _DatabaseTransient(Transient):
    """A driver error the dialect calls transient (its ``__cause__``), as the type :mod:`agl.retry` retries."""


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a dead connection; nothing left to save
        conn.close()


class SqlStore(Store):
    """A :class:`Store` on a SQL database, with group commits led by its callers.

    ``retries`` bounds how often a transient failure (a lock, a dropped connection,
    a serialization failure: what :meth:`Dialect.is_transient` says) is retried, with
    :mod:`agl.retry`'s exponential backoff from ``retry_delay_s``, before the call fails
    with :class:`StoreUnavailable`.
    ``max_readers`` bounds the reader connections.
    """

    def __init__(self, dialect: Dialect, *, retries: int = 8, retry_delay_s: float = 0.02, max_readers: int = 8):
        if retries < 0:
            raise ValueError(f"retries: must be at least 0, got {retries}")
        if max_readers < 1:
            raise ValueError(f"max_readers: must be at least 1, got {max_readers}")
        self.dialect = dialect
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.max_wait_s: float | None = None
        """Give up retrying a transient failure once this long has passed (None: after ``retries``)."""
        self._pool = _ReaderPool(lambda: dialect.connect(writer=False), max_readers)
        self._pending: deque[_Job] = deque()
        self._mutex = threading.Lock()
        self._leading = False  # some caller is running a group (or about to)
        self._idle = threading.Condition(self._mutex)  # notified when the lead is given up
        self._closed = False
        self._writer_conn: Any = None
        self._task_bodies: dict[str, str] = {}
        self._task_bytes = 0
        self._insert_texts: dict[tuple[str, int], str] = {}
        self._queue = RolloutQueue(
            self._sql, _ROLLOUT_SELECT, skip_locked=dialect.skip_locked, for_update=dialect.for_update
        )
        schema = _Job(self._create_schema)
        schema.lead = True
        self._run_in_transaction([schema])
        schema.outcome()

    # -- plumbing ------------------------------------------------------------------
    def _sql(self, text: str) -> str:
        return text if self.dialect.placeholder == "?" else text.replace("?", self.dialect.placeholder)

    def _create_schema(self, cur) -> None:
        if self.dialect.schema_lock:
            cur.execute(self.dialect.schema_lock)
        for statement in _schema(self.dialect):
            cur.execute(statement)
        for table, column, kind in _added_columns(self.dialect):
            cur.execute(f"SELECT * FROM {table} WHERE 1 = 0")
            have = {col[0].lower() for col in cur.description}
            cur.fetchall()
            if column not in have:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                if column == "reward":  # a store from before the column: its rollouts' rewards
                    cur.execute(f"UPDATE rollouts SET reward = {_final_reward_sql(self.dialect)}")
        for table, columns in _FIELD_COLUMNS.items():
            cur.execute(f"SELECT * FROM {table} WHERE 1 = 0")
            have = {col[0].lower() for col in cur.description}
            cur.fetchall()
            missing = [c for c in columns if c not in have]
            if missing:
                raise IncompatibleStore(
                    f"{self.dialect.describe()}: table {table} has no column {', '.join(missing)}: "
                    "the database was created by an older version of agl; start from a new database"
                )
        for statement in _LATER_INDEXES:
            cur.execute(statement)

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
                raise _DatabaseTransient(f"{type(exc).__name__}: {exc}") from exc

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
            retry_on=(_DatabaseTransient,),
        )
        return policy.call(once, on_retry=on_retry, give_up=give_up, started=started)

    def _writer_connection(self) -> Any:
        if self._writer_conn is None:
            self._writer_conn = self.dialect.connect(writer=True)
        return self._writer_conn

    def _drop_broken_writer(self, exc: BaseException) -> None:
        if self._writer_conn is not None and self.dialect.is_broken(self._writer_conn):
            _close_quietly(self._writer_conn)
            self._writer_conn = None

    def _run_in_transaction(self, jobs: list[_Job]) -> None:
        """Run every job in one transaction on the writer connection and settle each one.

        The group first runs without savepoints. If a job fails (not transiently),
        the transaction is rolled back and the group runs again with each job in its
        own savepoint, so the failure is that job's alone. A transient error anywhere
        rolls the whole group back and runs it again, so each job must be safe to run
        twice (they are: inserts ignore duplicates and a claim is found again by its
        claim id).
        """
        guarded = [False]

        def attempt() -> list[tuple[bool, Any]]:
            results: list[tuple[bool, Any]] = []
            cur = self._writer_connection().cursor()
            cur.execute(self.dialect.begin)
            try:
                if not guarded[0]:
                    try:
                        self._run_inserts(cur, jobs)
                        merged = self._run_merged(cur, jobs)
                        for i, job in enumerate(jobs):
                            if type(job.fn) is _Insert:
                                results.append((True, None))
                            elif i in merged:
                                results.append((True, merged[i]))
                            else:
                                results.append((True, job.fn(cur)))
                    except Exception as exc:
                        if self.dialect.is_transient(exc):
                            raise
                        cur.execute("ROLLBACK")
                        if len(jobs) == 1:
                            return [(False, exc)]
                        guarded[0] = True  # run again, each job in its own savepoint
                        results = []
                        cur.execute(self.dialect.begin)
                if guarded[0]:
                    for i, job in enumerate(jobs):
                        cur.execute(f"SAVEPOINT j{i}")
                        try:
                            results.append((True, job.fn(cur)))
                            cur.execute(f"RELEASE SAVEPOINT j{i}")
                        except Exception as exc:
                            if self.dialect.is_transient(exc):
                                raise
                            cur.execute(f"ROLLBACK TO SAVEPOINT j{i}")
                            cur.execute(f"RELEASE SAVEPOINT j{i}")
                            results.append((False, exc))
                cur.execute("COMMIT")
            except BaseException:
                # The connection may be gone (or the transaction already ended); the retry reconnects.
                with contextlib.suppress(Exception):
                    cur.execute("ROLLBACK")
                raise
            self._committed(len(jobs))
            return results

        try:
            # jobs that queued behind a group stuck on a lock have waited already
            oldest = min(job.created for job in jobs)
            results = self._with_retries(attempt, on_transient=self._drop_broken_writer, started=oldest)
        except BaseException as exc:
            for job in jobs:
                job.settle(False, exc)
            return
        for job, (ok, value) in zip(jobs, results, strict=False):
            job.settle(ok, value)

    def _run_inserts(self, cur, jobs: list[_Job]) -> None:
        """Run the group's inserts (see :class:`_Insert`), each table's rows in as few statements as can be."""
        inserts = [job.fn for job in jobs if type(job.fn) is _Insert]
        if len(inserts) == 1:
            inserts[0](cur)
            return
        tables: dict[tuple[str, tuple[str, ...]], list[tuple]] = {}
        for op in inserts:
            rows = tables.get((op.table, op.columns))
            if rows is None:
                tables[op.table, op.columns] = list(op.rows)
            else:
                rows.extend(op.rows)
        for (table, columns), rows in tables.items():
            self._insert_ignore(cur, table, columns, rows)

    def _run_merged(self, cur, jobs: list[_Job]) -> dict[int, Any]:
        """Run the group's claims together and its finishes together, where it has several of
        either (see :mod:`agl.store.claims`); their results by the job's place in the group.
        Jobs in one group were queued concurrently, so running these first is one of the
        orders they could have run in; what cannot be merged runs alone afterwards."""
        if len(jobs) < 2:
            return {}
        claims = [(i, job.fn.op) for i, job in enumerate(jobs) if type(job.fn) is _ClaimJob]
        finishes = [(i, job.fn.op) for i, job in enumerate(jobs) if type(job.fn) is _FinishJob]
        merged: dict[int, Any] = {}
        if len(claims) < 2 and len(finishes) < 2:
            return merged
        t = now()
        if len(claims) > 1:
            for (i, _), rows in zip(claims, self._queue.claim_all(cur, [c for _, c in claims], t), strict=False):
                if rows is not None:
                    merged[i] = self._with_tasks(cur, rows)
        if len(finishes) > 1:
            for (i, _), row in zip(finishes, self._queue.finish_all(cur, [f for _, f in finishes], t), strict=False):
                if row is not None:
                    merged[i] = row
        return merged

    def _committed(self, jobs: int) -> None:
        """Called on the writer after each commit (the SQLite store schedules checkpoints here)."""

    def _write(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(cursor)`` in a group transaction; return its result once committed."""
        [job] = self._write_all([fn])
        return job.outcome()

    def _write_all(self, fns: Sequence[Callable[[Any], Any]]) -> list[_Job]:
        """Queue several writes at once (they share a group) and return their settled jobs."""
        jobs = [_Job(fn) for fn in fns]
        if not jobs:
            return jobs
        with self._mutex:
            if self._closed:
                raise StoreUnavailable(f"{self.dialect.describe()} is closed")
            self._pending.extend(jobs)
            if self._leading:
                lead = False
            else:
                self._leading = lead = jobs[0].lead = True
        if lead:
            self._lead()
        for job in jobs:
            if job.done:
                continue
            try:
                job.lock.acquire()  # woken once: settled, or made the leader
            except BaseException:
                # Interrupted while waiting: the writes stay queued (they may still commit),
                # and a lead handed to this caller must not be lost.
                with self._mutex:
                    handed = False
                    for other in jobs:
                        other.abandoned = True
                        handed = handed or (other.lead and not other.done)
                if handed:
                    self._lead()
                raise
            if not job.done:
                self._lead()  # made the leader: this job heads the queue, so the first group runs it
        return jobs

    def _writer_free(self) -> bool:
        """Whether no write is running or queued right now (a write would lead at once)."""
        return not self._leading and not self._pending

    def _lead(self) -> None:
        """Run the queued jobs as group transactions, then pass the lead to the next caller in line.

        The leader's own job is in the first group. The lead passes to the caller
        at the head of the queue, who wakes to run the next group; a caller that
        stopped waiting (interrupted) is skipped by running its group here.
        """
        while True:
            group: list[_Job] = []
            try:
                with self._mutex:
                    group = [self._pending.popleft() for _ in range(min(len(self._pending), MAX_GROUP))]
                self._run_in_transaction(group)
            except BaseException as exc:  # an interrupt on the leader's thread: fail its group, not the others
                for job in group:
                    if not job.done:
                        job.settle(False, exc)
                self._pass_lead()
                raise
            if self._pass_lead():
                return

    def _pass_lead(self) -> bool:
        """Hand the lead on; False when the head of the queue stopped waiting (lead on)."""
        with self._mutex:
            if not self._pending:
                self._leading = False
                if self._closed:  # only close() waits for the lead to end
                    self._idle.notify_all()
                return True
            nxt = self._pending[0]
            if nxt.abandoned:
                return False
            nxt.lead = True
            nxt.lock.release()  # the next caller in line runs the next group
            return True

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

    def _insert_ignore(self, cur, table: str, columns: Sequence[str], rows: Sequence[tuple]) -> None:
        """Insert rows, ignoring those whose unique id is stored already: up to ``INSERT_ROWS``
        rows a statement (one statement runs in the database in one go; ``executemany``
        would step the database once a row)."""
        n = len(rows)
        if not n:
            return
        owned = table in _OWNED_IDS
        if n == 1:
            cur.execute(self._insert_sql(table, columns, 1), rows[0])
            if owned and cur.rowcount != 1:
                self._check_owners(cur, table, rows)
        else:
            step = min(INSERT_ROWS, 999 // len(columns))  # 999: the fewest parameters a statement may have (old SQLite)
            for i in range(0, n, step):
                part = rows[i : i + step]
                cur.execute(self._insert_sql(table, columns, len(part)), [v for row in part for v in row])
                if owned and cur.rowcount != len(part):
                    self._check_owners(cur, table, part)
        if table == "rewards":
            self._update_final_rewards(cur, {row[1] for row in rows if row[1] is not None})

    def _check_owners(self, cur, table: str, rows: Sequence[tuple]) -> None:
        """Some of ``rows`` (id, rollout id, …) were not inserted: their id is stored already. A
        retry of the same rollout's write is what idempotence is for; an id stored under another
        rollout is an :class:`~agl.errors.IdConflict` (the group's other writes are unaffected:
        a failed group runs again with each write in its own savepoint)."""
        column = _OWNED_IDS[table]
        ids = sorted({row[0] for row in rows})
        owners: dict[str, str | None] = {}
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ", ".join("?" for _ in part)
            cur.execute(self._sql(f"SELECT {column}, rollout_id FROM {table} WHERE {column} IN ({marks})"), part)
            owners.update(cur.fetchall())
        for row in rows:
            if owners.get(row[0], row[1]) != row[1]:
                raise IdConflict(f"{table}.{column}", row[0])

    def _update_final_rewards(self, cur, rollout_ids: set[str]) -> None:
        """Recompute ``rollouts.reward`` (the final reward, which the dashboard sorts and filters
        by) of rollouts that were given rewards: from the rewards table, so a retried write or a
        late reward leaves it right."""
        ids = sorted(rollout_ids)
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            cur.execute(
                self._sql(
                    f"UPDATE rollouts SET reward = {_final_reward_sql(self.dialect)} "
                    f"WHERE rollout_id IN ({', '.join('?' for _ in part)})"
                ),
                part,
            )

    def _insert_sql(self, table: str, columns: Sequence[str], n: int) -> str:
        key = (table, n)
        text = self._insert_texts.get(key)
        if text is None:
            marks = "(" + ", ".join("?" for _ in columns) + ")"
            text = self._sql(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join(marks for _ in range(n))}"
                " ON CONFLICT DO NOTHING"
            )
            self._insert_texts[key] = text
        return text

    # -- tasks ---------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[Task]) -> None:
        rows = [(t.task_id, t.split, _body(t)) for t in tasks]
        self._write(_Insert(self, "tasks", ("task_id", "split", "body"), rows))

    def get_task(self, task_id: str) -> Task:
        rows = self._read("SELECT body FROM tasks WHERE task_id = ?", [task_id])
        if not rows:
            raise NotFound("task", task_id)
        return Task.model_validate_json(rows[0][0], context=STORED)

    def query_tasks(self, *, split: str | None = None) -> Iterator[Task]:
        where, params = ["1 = 1"], []
        if split is not None:
            where.append("split = ?")
            params.append(split)
        for (body,) in self._paged("tasks", "body", where, params):
            yield Task.model_validate_json(body, context=STORED)

    # -- rollouts ------------------------------------------------------------------
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        rollouts = list(rollouts)
        task_ids = sorted({r.task_id for r in rollouts})

        def run(cur):
            if task_ids:
                marks = ", ".join("?" for _ in task_ids)
                cur.execute(self._sql(f"SELECT task_id FROM tasks WHERE task_id IN ({marks})"), task_ids)
                missing = set(task_ids) - {row[0] for row in cur.fetchall()}
                if missing:
                    raise NotFound("task", min(missing))
            rows = []
            for r in rollouts:
                if r.status != RolloutStatus.QUEUED:
                    raise InvalidTransition(
                        f"rollout {r.rollout_id}: enqueue needs status 'queued', got {r.status.value!r}"
                    )
                rows.append(
                    (
                        r.rollout_id,
                        r.task_id,
                        r.status.value,
                        0,
                        r.max_attempts,
                        r.timeout_s,
                        r.model_version,
                        r.step,
                        r.mode,
                        None,
                        None,
                        r.created_at,
                        None,
                        None,
                        None,
                        None,
                        _dumps(r.output),
                        r.max_response_tokens,
                        r.seed,
                        _dumps(r.resources) if r.resources else None,
                        r.resources_version,
                    )
                )
            self._insert_ignore(cur, "rollouts", _ROLLOUT_COLUMNS, rows)

        self._write(run)
        return rollouts

    def claim(self, runner_id: str, *, limit: int = 1, claim_id: str | None = None) -> list[Rollout]:
        fn, post = self._claim_op(runner_id, limit, claim_id)
        return post(self._write(fn))

    def _claim_op(self, runner_id: str, limit: int, claim_id: str | None):
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        # A claim id made here cannot have been used before: only the caller's own can repeat.
        claim = Claim(runner_id, limit, claim_id or new_id("claim-"), repeatable=claim_id is not None)
        return _ClaimJob(self, claim), self._claimed

    def _with_tasks(self, cur, rows: list[tuple]) -> tuple[list[tuple], dict[str, str], dict[str, str] | None]:
        """Claimed rows with their tasks' bodies: from the cache (tasks never change once
        stored), else read here (``read``, for :meth:`_claimed` to cache)."""
        bodies = self._task_bodies
        found, missing = {}, []
        for task_id in {row[1] for row in rows}:
            body = bodies.get(task_id)
            if body is None:
                missing.append(task_id)
            else:
                found[task_id] = body
        read = None
        if missing:
            marks = ", ".join("?" for _ in missing)
            cur.execute(self._sql(f"SELECT task_id, body FROM tasks WHERE task_id IN ({marks})"), sorted(missing))
            read = dict(cur.fetchall())
            found.update(read)
        return rows, found, read

    def _claimed(self, result) -> list[Rollout]:
        rows, found, read = result
        if read:
            self._remember_tasks(read)
        rollouts = []
        for row in rows:
            rollout = _rollout_from_row(row)
            body = found.get(rollout.task_id)
            rollout.task = None if body is None else Task.model_validate_json(body, context=STORED)
            rollouts.append(rollout)
        rollouts.sort(key=lambda r: r.created_at)
        return rollouts

    def _remember_tasks(self, bodies: dict[str, str]) -> None:
        """Cache task bodies (bounded by total size; tasks are immutable once stored)."""
        size = sum(len(b) for b in bodies.values())
        if self._task_bytes + size > TASK_CACHE_BYTES:
            self._task_bodies = {}  # claims in flight keep the dict they started with
            self._task_bytes = 0
        self._task_bodies.update(bodies)
        self._task_bytes += size

    def heartbeat(self, rollout_ids: Sequence[str], runner_id: str) -> None:
        ids = list(rollout_ids)
        if not ids:
            return
        t = now()

        def run(cur):
            cur.executemany(
                self._sql("UPDATE rollouts SET heartbeat_at = ? WHERE rollout_id = ? AND runner_id = ? AND status = ?"),
                [(t, rid, runner_id, RolloutStatus.RUNNING.value) for rid in ids],
            )

        self._write(run)

    def finish(self, rollout_id: str, status: RolloutStatus, **options: Unpack[FinishOptions]) -> Rollout:
        fn, post = self._finish_op(rollout_id, status, **with_defaults(FinishOptions, options, "finish"))
        return post(self._write(fn))

    def _finish_op(
        self, rollout_id: str, status: RolloutStatus, error: str | None, output: object, attempt: int | None = None
    ):
        status = RolloutStatus(status)
        if not status.terminal:
            raise InvalidTransition(f"status: finish needs a terminal status, got {status.value!r}")
        if attempt is not None and not 1 <= attempt <= INT64_MAX:
            raise ValueError(f"attempt: must be from 1 to {INT64_MAX}, got {attempt}")
        check_json(output, "output")
        return _FinishJob(self, Finish(rollout_id, status, error, _dumps(output), attempt)), _rollout_from_row

    def cancel(self, rollout_ids: Sequence[str]) -> None:
        ids = list(rollout_ids)
        t = now()

        def run(cur):
            for rid in ids:
                cur.execute(
                    self._sql(f"SELECT {_ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?{self.dialect.for_update}"),
                    (rid,),
                )
                row = cur.fetchone()
                if row is None:
                    raise NotFound("rollout", rid)
                if RolloutStatus(row[2]).terminal:
                    continue
                if row[2] == RolloutStatus.RUNNING.value:
                    self._queue.end_attempt(cur, row, RolloutStatus.CANCELLED, "cancelled", _NULL, t)
                else:
                    cur.execute(
                        self._sql("UPDATE rollouts SET status = ?, ended_at = ?, error = ? WHERE rollout_id = ?"),
                        (RolloutStatus.CANCELLED.value, t, "cancelled", rid),
                    )

        self._write(run)

    def expire(self, *, heartbeat_timeout_s: float, now: float | None = None) -> list[Rollout]:
        from agl.schema import now as _now

        t = _now() if now is None else now

        def run(cur):
            cur.execute(
                self._sql(
                    f"""SELECT {_ROLLOUT_SELECT} FROM rollouts WHERE status = ? AND (
                        heartbeat_at < ?
                        OR (timeout_s IS NOT NULL AND started_at + timeout_s < ?)){self.dialect.for_update}"""
                ),
                (RolloutStatus.RUNNING.value, t - heartbeat_timeout_s, t),
            )
            rows = cur.fetchall()
            for row in rows:
                late = row[5] is not None and row[12] + row[5] < t
                reason = f"timed out after {row[5]}s" if late else f"no heartbeat for {heartbeat_timeout_s}s"
                self._queue.end_attempt(cur, row, RolloutStatus.TIMED_OUT, reason, _NULL, t)
            return [row[0] for row in rows]

        return [self.get_rollout(rid) for rid in self._write(run)]

    def get_rollout(self, rollout_id: str) -> Rollout:
        rows = self._read(f"SELECT {_ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?", [rollout_id])
        if not rows:
            raise NotFound("rollout", rollout_id)
        return _rollout_from_row(rows[0])

    def query_rollouts(self, *, task_id=None, status=None, step=None, since=None, until=None, rollout_ids=None):
        where, params = ["1 = 1"], []
        given = ("task_id = ?", task_id), ("step = ?", step), ("created_at >= ?", since), ("created_at < ?", until)
        self._where_given(where, params, *given)
        if status is not None:
            statuses = [status] if isinstance(status, (str, RolloutStatus)) else list(status)
            self._in("status", [RolloutStatus(s).value for s in statuses], where, params)
        if rollout_ids is not None:
            ids = list(rollout_ids)
            for i in range(0, max(len(ids), 1), PAGE_SIZE):
                chunk_where, chunk_params = list(where), list(params)
                self._in("rollout_id", ids[i : i + PAGE_SIZE], chunk_where, chunk_params)
                for row in self._paged("rollouts", _ROLLOUT_SELECT, chunk_where, chunk_params):
                    yield _rollout_from_row(row)
            return
        for row in self._paged("rollouts", _ROLLOUT_SELECT, where, params):
            yield _rollout_from_row(row)

    def attempts(self, rollout_id: str) -> list[Attempt]:
        # Ended attempts are in their table; a running one is the rollout's own row (see
        # agl.store.claims). One statement, so one snapshot of both.
        rows = self._read(
            f"""SELECT rollout_id, attempt, runner_id, status, started_at, ended_at, error, heartbeat_at
                FROM attempts WHERE rollout_id = ?
            UNION ALL
            SELECT rollout_id, attempt, runner_id, status, started_at, NULL, NULL, heartbeat_at FROM rollouts
                WHERE rollout_id = ? AND status = '{RolloutStatus.RUNNING.value}' AND NOT EXISTS (
                    SELECT 1 FROM attempts WHERE attempts.rollout_id = rollouts.rollout_id
                    AND attempts.attempt = rollouts.attempt)
            ORDER BY attempt""",
            [rollout_id, rollout_id],
        )
        keys = ("rollout_id", "attempt", "runner_id", "status", "started_at", "ended_at", "error", "heartbeat_at")
        return [Attempt.model_validate(dict(zip(keys, row, strict=False))) for row in rows]

    # -- observations --------------------------------------------------------------
    _SPAN_COLUMNS = ("span_id", "rollout_id", "kind", "start_time", "body", *_FIELD_COLUMNS["spans"])
    _CALL_COLUMNS = (
        "call_id",
        "rollout_id",
        "body",
        "prompt_ids",
        "response_ids",
        "response_logprobs",
        "behaviour_logprobs",
        *_FIELD_COLUMNS["llm_calls"],
    )
    _REWARD_COLUMNS = ("reward_id", "rollout_id", "body")

    def _spans_op(self, spans: Iterable[Span]) -> Callable[[Any], Any]:
        rows = []
        append = rows.append
        for s in spans:
            a = s.attributes
            if a:
                resp, agent = a.get("gen_ai.response.id"), a.get("gen_ai.agent.name")
                if resp is not None and resp.__class__ is not str:
                    resp = _attr_text(resp)
                if agent is not None and agent.__class__ is not str:
                    agent = _attr_text(agent)
            else:
                resp = agent = None
            append((s.span_id, s.rollout_id, s.kind, s.start_time, _body(s), s.seq, s.end_time, resp, agent))
        return _Insert(self, "spans", self._SPAN_COLUMNS, rows)

    def _llm_calls_op(self, calls: Iterable[LLMCall]) -> Callable[[Any], Any]:
        rows = []
        for c in calls:
            body = _body(c, _TOKEN_EXCLUDE)
            logprobs = None if c.response_logprobs is None else to_bytes(c.response_logprobs)
            behaviour = None if c.behaviour_logprobs is None else to_bytes(c.behaviour_logprobs)
            rows.append(
                (
                    c.call_id,
                    c.rollout_id,
                    body,
                    to_bytes(c.prompt_ids),
                    to_bytes(c.response_ids),
                    logprobs,
                    behaviour,
                    c.seq,
                    c.created_at,
                    c.model_version,
                    c.policy,
                )
            )
        return _Insert(self, "llm_calls", self._CALL_COLUMNS, rows)

    def _rewards_op(self, rewards: Iterable[Reward]) -> Callable[[Any], Any]:
        rows = [(r.reward_id, r.rollout_id, _body(r)) for r in rewards]
        for reward_id, rollout_id, _ in rows:
            mine = reward_id.startswith(f"rw-{rollout_id}-a")
            if reward_id.startswith("rw-") and not mine and ROLLOUT_REWARD_ID.fullmatch(reward_id):
                raise IdConflict("rewards.reward_id", reward_id)
        return _Insert(self, "rewards", self._REWARD_COLUMNS, rows)

    def add_spans(self, spans: Iterable[Span]) -> None:
        self._write(self._spans_op(spans))

    def add_llm_calls(self, calls: Iterable[LLMCall]) -> None:
        self._write(self._llm_calls_op(calls))

    def add_rewards(self, rewards: Iterable[Reward]) -> None:
        self._write(self._rewards_op(rewards))

    def _write_batch(
        self,
        *,
        spans: Sequence[Span] = (),
        llm_calls: Sequence[LLMCall] = (),
        rewards: Sequence[Reward] = (),
        claims: Sequence[tuple[str, int, str | None]] = (),
        finishes: Sequence[tuple[str, RolloutStatus, str | None, Any, int | None]] = (),
    ) -> tuple[list[list[Rollout] | BaseException], list[Rollout | BaseException]]:
        """Several callers' writes queued together, so they share one group commit (the store server's batch).

        A failed observation write raises. Each claim and finish has its own outcome:
        its result, or the exception it raised.
        """
        fns: list[Callable[[Any], Any]] = []
        if spans:
            fns.append(self._spans_op(spans))
        if llm_calls:
            fns.append(self._llm_calls_op(llm_calls))
        if rewards:
            fns.append(self._rewards_op(rewards))
        observed = len(fns)
        posts: list[Callable[[Any], Any] | BaseException] = []
        for runner_id, limit, claim_id in claims:
            try:
                fn, post = self._claim_op(runner_id, limit, claim_id)
            except Exception as exc:
                posts.append(exc)
                continue
            fns.append(fn)
            posts.append(post)
        split = len(posts)
        for rollout_id, status, error, output, attempt in finishes:
            try:
                fn, post = self._finish_op(rollout_id, status, error, output, attempt)
            except Exception as exc:
                posts.append(exc)
                continue
            fns.append(fn)
            posts.append(post)
        jobs = iter(self._write_all(fns))
        for _ in range(observed):
            next(jobs).outcome()
        outcomes: list[Any] = []
        for post in posts:
            if isinstance(post, BaseException):
                outcomes.append(post)
                continue
            job = next(jobs)
            try:
                outcomes.append(post(job.outcome()))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes[:split], outcomes[split:]

    def query_spans(self, *, rollout_id=None, rollout_ids=None, kind=None, production=False, since=None, until=None):
        where, params = ["1 = 1"], []
        self._filter_rollout(where, params, rollout_id, rollout_ids, production)
        self._where_given(where, params, ("kind = ?", kind), ("start_time >= ?", since), ("start_time < ?", until))
        for (body,) in self._paged("spans", "body", where, params):
            yield Span.model_validate_json(body, context=STORED)

    def query_llm_calls(self, *, rollout_id=None, rollout_ids=None, call_ids=None, production=False):
        where, params = ["1 = 1"], []
        self._filter_rollout(where, params, rollout_id, rollout_ids, production)
        if call_ids is not None:
            self._in("call_id", list(call_ids), where, params)
        for body, prompt, response, logprobs, behaviour in self._paged(
            "llm_calls", "body, prompt_ids, response_ids, response_logprobs, behaviour_logprobs", where, params
        ):
            data = json.loads(body)
            data["prompt_ids"] = int32_array(bytes(prompt))
            data["response_ids"] = int32_array(bytes(response))
            data["response_logprobs"] = None if logprobs is None else float32_array(bytes(logprobs))
            data["behaviour_logprobs"] = None if behaviour is None else float32_array(bytes(behaviour))
            yield LLMCall.model_validate(data, context=STORED)

    def query_rewards(self, *, rollout_id=None, rollout_ids=None, production=False):
        where, params = ["1 = 1"], []
        self._filter_rollout(where, params, rollout_id, rollout_ids, production)
        for (body,) in self._paged("rewards", "body", where, params):
            yield Reward.model_validate_json(body)

    # -- bulk reads for building transitions ----------------------------------------
    # What agl_trainer.transitions reads of ended rollouts, column by column: no record is decoded
    # whole. A store that offers these four methods gets the builder's fast path; any
    # other store is read through the queries above.
    _BULK = 500  # ids per statement

    def transition_rows(self, rollout_ids: Sequence[str]) -> TransitionRows:
        """The LLM calls, LLM spans and rewards of these rollouts, as raw rows (see :class:`TransitionRows`).

        One statement per table for up to 500 rollouts; the calls' and spans' fields come
        from the columns that copy them at write time (``_FIELD_COLUMNS``), the rewards'
        are extracted from their JSON by the database, the token columns come as stored. Rows come grouped by rollout
        (``ORDER BY rollout_id, pk``: the ``(rollout_id, pk)`` index gives that order, where
        ``ORDER BY pk`` alone made the database sort every row, token blobs included).
        """
        f, d = self.dialect.json_field, self.dialect
        calls = self._read_in(
            "SELECT rollout_id, call_id, seq, created_at, model_version, prompt_ids, response_ids, response_logprobs, "
            "behaviour_logprobs, policy FROM llm_calls WHERE",
            "rollout_id",
            rollout_ids,
            " ORDER BY rollout_id, pk",
        )
        spans = self._read_in(
            "SELECT rollout_id, span_id, seq, start_time, end_time, response_id, agent"
            " FROM spans WHERE kind = 'llm' AND",
            "rollout_id",
            rollout_ids,
            " ORDER BY rollout_id, pk",
        )
        rewards = self._read_in(
            f"SELECT rollout_id, reward_id, {f('body', ['name'])}, {f('body', ['value'], d.real)}, "
            f"{f('body', ['source'])}, {f('body', ['created_at'], d.real)} FROM rewards WHERE",
            "rollout_id",
            rollout_ids,
            " ORDER BY rollout_id, pk",
        )
        return TransitionRows(calls, spans, rewards)

    def span_messages(self, span_ids: Sequence[str]) -> list[tuple]:
        """``(span_id, input, output)`` of these spans: their ``gen_ai.input.messages`` and
        ``gen_ai.output.messages`` attributes as :meth:`Dialect.json_field` gives them."""
        f = self.dialect.json_field
        return self._read_in(
            f"SELECT span_id, {f('body', ['attributes', 'gen_ai.input.messages'])}, "
            f"{f('body', ['attributes', 'gen_ai.output.messages'])} FROM spans WHERE",
            "span_id",
            span_ids,
        )

    def call_payloads(self, call_ids: Sequence[str]) -> list[tuple]:
        """``(call_id, request, response)`` of these LLM calls: the JSON text of the gateway's
        request and response bodies (None where there was none)."""
        f = self.dialect.json_field
        return self._read_in(
            f"SELECT call_id, {f('body', ['request'])}, {f('body', ['response'])} FROM llm_calls WHERE",
            "call_id",
            call_ids,
        )

    def get_tasks(self, task_ids: Sequence[str]) -> dict[str, Task]:
        """These tasks by id; ids not in the store are left out."""
        out = {}
        for (body,) in self._read_in("SELECT body FROM tasks WHERE", "task_id", task_ids):
            task = Task.model_validate_json(body, context=STORED)
            out[task.task_id] = task
        return out

    def _read_in(self, head: str, column: str, ids: Sequence[str], tail: str = "") -> list[Any]:
        """All rows of ``{head} {column} IN (ids){tail}``, one statement per 500 ids."""
        ids = list(ids)
        rows: list[Any] = []
        for i in range(0, len(ids), self._BULK):
            part = ids[i : i + self._BULK]
            rows.extend(self._read(f"{head} {column} IN ({', '.join('?' for _ in part)}){tail}", part))
        return rows

    # -- model versions ------------------------------------------------------------
    def add_model_version(self, version: ModelVersion) -> None:
        row = [(version.version, version.model_dump_json())]
        self._write(_Insert(self, "model_versions", ("version", "body"), row))

    def get_model_version(self, version: str) -> ModelVersion:
        rows = self._read("SELECT body FROM model_versions WHERE version = ?", [version])
        if not rows:
            raise NotFound("model version", version)
        return ModelVersion.model_validate_json(rows[0][0], context=STORED)

    def latest_model_version(self) -> ModelVersion | None:
        rows = self._read("SELECT body FROM model_versions ORDER BY pk DESC LIMIT 1")
        return ModelVersion.model_validate_json(rows[0][0], context=STORED) if rows else None

    # -- step records ---------------------------------------------------------------
    def add_step_record(self, run_id: str, record: dict[str, Any]) -> None:
        run_id, kind, step, body = step_record_row(run_id, record)
        row = [(run_id, kind, step, now(), body)]
        self._write(_Insert(self, "run_steps", ("run_id", "kind", "step", "created_at", "body"), row))

    def step_records(self, run_id: str | None = None) -> list[dict[str, Any]]:
        where, params = ("WHERE run_id = ?", [run_id]) if run_id is not None else ("", [])
        rows = self._read(f"SELECT run_id, body FROM run_steps {where} ORDER BY pk", params)
        return [{**json.loads(body), "run_id": rid} for rid, body in rows]

    def select(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one read-only query (``?`` placeholders) and return its rows.

        For readers that need what the :class:`Store` methods do not offer (the dashboard's
        paginated, sorted lists); the connection goes back to the pool at once.
        """
        return self._read(sql, params)

    # -- the rest ------------------------------------------------------------------
    def stats(self) -> StoreStats:
        def count(table: str) -> int:
            return int(self._read(f"SELECT COUNT(*) FROM {table}")[0][0])

        rollouts = {status: int(n) for status, n in self._read("SELECT status, COUNT(*) FROM rollouts GROUP BY status")}
        return StoreStats(
            tasks=count("tasks"),
            rollouts=rollouts,
            spans=count("spans"),
            llm_calls=count("llm_calls"),
            rewards=count("rewards"),
            model_versions=count("model_versions"),
        )

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            # Writes already queued are committed; later ones are refused.
            while self._leading:
                self._idle.wait()
        if self._writer_conn is not None:
            _close_quietly(self._writer_conn)
        self._pool.close()
