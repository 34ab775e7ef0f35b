"""The store on a SQL database, shared by the SQLite and PostgreSQL backends.

Writes are committed in groups on one writer connection per store: every caller
waiting at the same moment shares one transaction, led by the callers themselves
(:mod:`agl.store.sql.commit`). A write returns once its transaction has committed, so
whatever was acknowledged survives a SIGKILL of the process. Reads use pooled
connections and page through results by primary key, so a query over millions of rows
holds one page at a time (:mod:`agl.store.sql.connections`).

A backend supplies a :class:`Dialect`: how to connect, its column types, its
placeholder and how it locks rows for a claim.

:class:`SqlStore` is put together from one module per concern:

- :mod:`~agl.store.sql.rollouts`: tasks, rollouts and claims;
- :mod:`~agl.store.sql.observations`: spans and LLM calls;
- :mod:`~agl.store.sql.rewards`: rewards and each rollout's final reward;
- :mod:`~agl.store.sql.steps`: model versions and the trainer's step records;
- :mod:`~agl.store.sql.dashboard`: the dashboard's rollout list;
- :mod:`~agl.store.sql.dialect` (the schema), :mod:`~agl.store.sql.rows` (rows and records),
  :mod:`~agl.store.sql.jobs` (the writes a group runs).

Measured beside the commit before the split (one 1,360-line module; shared 2-core host at load
average 10-17, where whole-benchmark wall figures moved 50 % between turns, so CPU minimums
over interleaved runs decide): W1's writes on one thread, 150 rollouts a run, 6 runs each,
CPU per rollout min 0.741 -> 0.737 ms through the store's methods and 0.616 -> 0.636 ms through
:meth:`SqlStore.write_batch`; the dashboard's reads called in-process on 100,000 rollouts, min
of 15 calls over 4 runs each, 0.150 -> 0.152 ms for the newest page, 0.51 -> 0.52 ms for 200 a
page, 0.244 -> 0.247 ms filtered by step and model (the pages over every rollout, 13-230 ms,
moved with the load either way).
"""

from agl.store.bulk import TransitionRows
from agl.store.sql.commit import INSERT_ROWS, MAX_GROUP
from agl.store.sql.connections import PAGE_SIZE
from agl.store.sql.dialect import Dialect
from agl.store.sql.rollouts import TASK_CACHE_BYTES
from agl.store.sql.store import SqlStore

__all__ = ["INSERT_ROWS", "MAX_GROUP", "PAGE_SIZE", "TASK_CACHE_BYTES", "Dialect", "SqlStore", "TransitionRows"]
