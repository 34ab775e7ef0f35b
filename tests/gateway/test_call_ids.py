"""A call's id (:func:`agl_trainer.gateway.call_ids.new_call_id`): the form clients read, never
the same twice, not to be told from the ones before it, another in a forked child."""

from __future__ import annotations

import os
import re

from agl_trainer.gateway.call_ids import new_call_id


def test_an_id_is_its_prefix_and_32_hex_digits():
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", new_call_id("chatcmpl-"))
    assert re.fullmatch(r"resp_[0-9a-f]{32}", new_call_id("resp_"))


def test_ids_never_repeat_and_show_no_counter():
    ids = [new_call_id("") for _ in range(50_000)]
    assert len(set(ids)) == len(ids)
    # a counter would show in the ids; a keyed hash spreads each hex digit evenly over its place
    for place in (0, 15, 31):
        counts = {d: 0 for d in "0123456789abcdef"}
        for i in ids:
            counts[i[place]] += 1
        assert min(counts.values()) > len(ids) / 16 * 0.85, (place, counts)


def test_a_forked_child_draws_ids_of_its_own():
    """A child shares the parent's counter at the fork: its ids differ by a key of its own."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, "".join(new_call_id("") for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 1000).decode()
    os.close(read)
    mine = "".join(new_call_id("") for _ in range(3))
    assert len(child) == 96 and child != mine
