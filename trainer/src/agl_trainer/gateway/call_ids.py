"""The ids of the gateway's calls (``chatcmpl-...``, ``resp_...``): :func:`new_call_id`.

A call's id is the response id its client reads and the key its record is stored under (a
store keeps the first record of an id), so it must be unique and unpredictable: a client that
could tell the next one could store a record of its own under it first. After its prefix it is
12 hex digits of the time in milliseconds, then a keyed hash (BLAKE2b, 128 bits) of a counter
under a random key of the process, drawn again in a forked child: unpredictable without the key,
and unique in practice, as ``os.urandom(16)`` was. The time says no more than the answer's
``created`` does.

Why the time first: a store keeps its call ids in a unique index (a B-tree), and ids that sort in
the order they are made are each inserted at the index's right edge, in the pages the store
touched last, where random ids land on any page of an index that outgrows the cache.
``python -m tests.benchmarks.bench_call_id_order`` (the store's own ``add_llm_calls``, SQLite,
16 records of the benchmark's call a write, 12,000 records into a fresh database, the two kinds
of id taking turns, 3 rounds), 2026-11-29 on the shared 2-core host at load average 10-11: 25.2 us
of CPU a record with these ids against 35.3 us with random ones (0.71x; by quarter of a turn
22-35 against 24-49 us, the random ones' cost rising as the index grows); again at load 5.4-5.6,
22.9 against 40.6 us (0.56x; 20-27 against 28-43 us). 28dbf9d's gateway's
ids were random too (``uuid4``). What it does to the gateway's whole cost a call is in
:mod:`agl_trainer.gateway.app`.

It takes no system call: ``os.urandom`` releases the GIL for its ``getrandom``, and whatever
other thread wanted the GIL then (the store writer's, writing a batch of records) took it in the
middle of a call; ``cProfile`` on the event loop's thread, one client, put 70 us a call there on
average (issue 46).
"""

from __future__ import annotations

import itertools
import os
import time
from hashlib import blake2b

_KEY_BYTES = 32
_key = os.urandom(_KEY_BYTES)
_numbers = itertools.count()


def new_call_id(prefix: str) -> str:
    """``prefix``, 12 hex digits of the time in milliseconds (ids made later sort after, while the
    clock does not step back), and 32 hex digits never the same twice in a process nor (by its
    random key) across processes."""
    number = next(_numbers).to_bytes(8, "little")
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{blake2b(number, key=_key, digest_size=16).hexdigest()}"


def _draw_key() -> None:
    global _key
    _key = os.urandom(_KEY_BYTES)


os.register_at_fork(after_in_child=_draw_key)
