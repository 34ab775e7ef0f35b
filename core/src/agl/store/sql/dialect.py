"""What differs between SQL databases (:class:`Dialect`) and the tables every SQL store has.

The schema is created (or brought up to date) once per store, in its first transaction:
:func:`create_schema`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from agl.errors import IncompatibleStore


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


def final_reward_sql(d: Dialect) -> str:
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
FIELD_COLUMNS = {
    "spans": ("seq", "end_time", "response_id", "agent"),
    "llm_calls": ("seq", "created_at", "model_version", "policy"),
}


def create_schema(cur, d: Dialect) -> None:
    """Create the tables and indexes, adding the columns an older database lacks; refuse a database
    too old to bring up to date (:class:`~agl.errors.IncompatibleStore`)."""
    if d.schema_lock:
        cur.execute(d.schema_lock)
    for statement in _schema(d):
        cur.execute(statement)
    for table, column, kind in _added_columns(d):
        if column not in _columns_of(cur, table):
            cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            if column == "reward":  # a store from before the column: its rollouts' rewards
                cur.execute(f"UPDATE rollouts SET reward = {final_reward_sql(d)}")
    for table, columns in FIELD_COLUMNS.items():
        have = _columns_of(cur, table)
        missing = [c for c in columns if c not in have]
        if missing:
            raise IncompatibleStore(
                f"{d.describe()}: table {table} has no column {', '.join(missing)}: "
                "the database was created by an older version of agl; start from a new database"
            )
    for statement in _LATER_INDEXES:
        cur.execute(statement)


def _columns_of(cur, table: str) -> set[str]:
    cur.execute(f"SELECT * FROM {table} WHERE 1 = 0")
    have = {col[0].lower() for col in cur.description}
    cur.fetchall()
    return have
