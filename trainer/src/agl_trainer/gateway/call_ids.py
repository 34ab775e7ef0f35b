"""The ids of the gateway's calls (``chatcmpl-...``, ``resp_...``): :func:`new_call_id`.

A call's id is the response id its client reads and the key its record is stored under (a
store keeps the first record of an id), so it must be unique and unpredictable: a client that
could tell the next one could store a record of its own under it first. It is a keyed hash
(BLAKE2b, 128 bits) of a counter under a random key of the process, drawn again in a forked
child: unpredictable without the key, and unique in practice, as ``os.urandom(16)`` was. It
takes no system call: ``os.urandom`` releases the GIL for its ``getrandom``, and whatever other
thread wanted the GIL then (the store writer's, writing a batch of records) took it in the
middle of a call; ``cProfile`` on the event loop's thread, one client, put 70 us a call there
on average (issue 46).
"""

from __future__ import annotations

import itertools
import os
from hashlib import blake2b

_KEY_BYTES = 32
_key = os.urandom(_KEY_BYTES)
_numbers = itertools.count()


def new_call_id(prefix: str) -> str:
    """``prefix`` and 32 hex digits, never the same twice in a process nor (by its random key)
    across processes."""
    number = next(_numbers).to_bytes(8, "little")
    return prefix + blake2b(number, key=_key, digest_size=16).hexdigest()


def _draw_key() -> None:
    global _key
    _key = os.urandom(_KEY_BYTES)


os.register_at_fork(after_in_child=_draw_key)
