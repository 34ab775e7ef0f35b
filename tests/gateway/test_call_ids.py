"""A call's id (:func:`agl_trainer.gateway.call_ids.new_call_id`): the form clients read, never
the same twice, sorting in the order made, its random part not to be told from the ones before
it, another in a forked child."""

from __future__ import annotations

import os
import re
import time

from agl_trainer.gateway.call_ids import new_call_id


def test_an_id_is_its_prefix_the_time_and_32_hex_digits():
    before = time.time_ns() // 1_000_000
    chat, resp = new_call_id("chatcmpl-"), new_call_id("resp_")
    after = time.time_ns() // 1_000_000
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{44}", chat)
    assert re.fullmatch(r"resp_[0-9a-f]{44}", resp)
    for made in (int(chat.removeprefix("chatcmpl-")[:12], 16), int(resp.removeprefix("resp_")[:12], 16)):
        assert before <= made <= after  # the time in milliseconds


def test_ids_sort_in_the_order_they_are_made():
    """So a store's unique index on them takes each at its right edge (see the module)."""
    ids = []
    for _ in range(5):
        ids += [new_call_id("chatcmpl-") for _ in range(200)]
        time.sleep(0.002)
    times = [i[9:21] for i in ids]
    assert times == sorted(times) and len(set(times)) >= 5
    assert sorted(ids[:: len(ids) // 5]) == ids[:: len(ids) // 5]  # ids of different milliseconds


def test_ids_never_repeat_and_show_no_counter():
    ids = [new_call_id("")[12:] for _ in range(50_000)]  # the hashed part, after the time
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
    assert len(child) == 3 * 44
    assert [child[k + 12 : k + 44] for k in (0, 44, 88)] != [mine[k + 12 : k + 44] for k in (0, 44, 88)]
