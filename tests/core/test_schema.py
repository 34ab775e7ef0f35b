"""The data models: JSON round trips, packed token arrays, field-named errors, the status machine."""

from __future__ import annotations

import base64
import json
import math
import struct
from array import array

import pytest
from pydantic import ValidationError

from agl.schema import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATUSES,
    Attempt,
    LLMCall,
    ModelVersion,
    Reward,
    Rollout,
    RolloutStatus,
    Span,
    StoreStats,
    Task,
    Transition,
)
from agl.tokens import STORED, float32_array, int32_array, to_bytes

TASK = Task(
    task_id="t1",
    input={"question": "2+3?", "answer": 5, "nested": [1, {"a": None}]},
    split="val",
    metadata={"source": "gsm8k"},
)

EXAMPLES = [
    TASK,
    Rollout(
        rollout_id="ro-1",
        task_id="t1",
        status=RolloutStatus.RUNNING,
        attempt=2,
        max_attempts=3,
        timeout_s=30.5,
        model_version="v3",
        step=7,
        mode="val",
        runner_id="r",
        claim_id="c",
        started_at=1.5,
        heartbeat_at=2.5,
        error="ValueError: x",
        output={"answer": "5", "list": [1, 2.5, "x"]},
        task=TASK,
    ),
    Attempt(
        rollout_id="ro-1",
        attempt=1,
        runner_id="r",
        status=RolloutStatus.FAILED,
        started_at=1.0,
        ended_at=2.0,
        error="boom",
    ),
    Span(
        span_id="s1",
        trace_id="tr",
        parent_id="s0",
        rollout_id="ro-1",
        seq=3,
        name="chat",
        kind="llm",
        start_time=1.25,
        end_time=2.5,
        status="ok",
        attributes={"gen_ai.response.id": "c1", "gen_ai.usage.input_tokens": 12, "agl.list": [1, "a", None]},
    ),
    LLMCall(
        call_id="c1",
        rollout_id="ro-1",
        seq=3,
        requested_model="gpt-4o",
        request={"messages": []},
        response={"choices": [{"index": 0}]},
        prompt_ids=[1, 2, 2**31 - 1, 0],  # the extremes of a token id (negative ones are refused)
        response_ids=[7, 8, 0],
        response_logprobs=[-0.5, -3.4028234663852886e38, 0.0],  # the lowest finite float32 (infinities are refused)
        model_version="v3",
        latency_s=0.125,
    ),
    LLMCall(call_id="c2", prompt_ids=[], response_ids=[]),
    Reward(reward_id="rw1", rollout_id="ro-1", span_id="s1", name="format", value=-0.75, source="plugin", seq=4),
    Transition(
        rollout_id="ro-1",
        task_id="t1",
        step=0,
        agent="solver",
        prompt_ids=[1, 2],
        response_ids=[3],
        response_logprobs=[-0.25],
        reward=0.5,
        model_version="v3",
        token_source="engine",
        call_id="c1",
        weight=0.5,
    ),
    Transition(
        rollout_id="ro-1", task_id="t1", step=1, prompt_ids=[1], response_ids=[2], reward=0.0, token_source="text"
    ),
    ModelVersion(version="v3", path="/ckpt/3", base_model="smollm2", step=3, metadata={"lr": 1e-5}),
    StoreStats(tasks=1, rollouts={"queued": 2}, spans=3, llm_calls=4, rewards=5, model_versions=6),
]


@pytest.mark.parametrize("model", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_model_round_trips_through_json_unchanged(model):
    text = model.model_dump_json()
    again = type(model).model_validate_json(text)
    assert again == model
    assert again.model_dump_json() == text
    assert type(model).model_validate(json.loads(text)) == model  # through plain JSON values too


def test_token_arrays_are_base64_of_packed_little_endian_values_in_json():
    call = EXAMPLES[4]
    data = json.loads(call.model_dump_json())
    assert isinstance(data["prompt_ids"], str) and "[" not in data["prompt_ids"]
    assert base64.b64decode(data["prompt_ids"]) == struct.pack("<4i", 1, 2, 2**31 - 1, 0)
    assert base64.b64decode(data["response_ids"]) == struct.pack("<3i", 7, 8, 0)
    assert base64.b64decode(data["response_logprobs"]) == struct.pack("<3f", -0.5, -3.4028234663852886e38, 0.0)
    transition = json.loads(EXAMPLES[7].model_dump_json())
    assert base64.b64decode(transition["prompt_ids"]) == struct.pack("<2i", 1, 2)
    assert transition["response_logprobs"] == base64.b64encode(struct.pack("<f", -0.25)).decode()


def test_token_arrays_are_int32_and_float32_arrays_in_python():
    call = EXAMPLES[4]
    assert isinstance(call.prompt_ids, array) and call.prompt_ids.typecode == "i"
    assert isinstance(call.response_logprobs, array) and call.response_logprobs.typecode == "f"
    assert call.model_dump()["prompt_ids"] == call.prompt_ids  # Python mode keeps the array


@pytest.mark.parametrize(
    "given",
    [
        [1, 2, 3],
        (1, 2, 3),
        array("i", [1, 2, 3]),
        array("l", [1, 2, 3]),
        struct.pack("<3i", 1, 2, 3),
        base64.b64encode(struct.pack("<3i", 1, 2, 3)).decode(),
    ],
    ids=["list", "tuple", "array", "long-array", "bytes", "base64"],
)
def test_token_ids_accept_lists_arrays_bytes_and_base64(given):
    call = LLMCall(call_id="c", prompt_ids=given, response_ids=[])
    assert list(call.prompt_ids) == [1, 2, 3]


def test_packing_helpers_round_trip():
    ids = int32_array([0, -1, 2**31 - 1, -(2**31)])
    assert int32_array(to_bytes(ids)) == ids
    logprobs = float32_array([-0.5, 0.0, -math.inf])
    assert float32_array(to_bytes(logprobs)) == logprobs


def _error_of(model, **fields):
    with pytest.raises(ValidationError) as info:
        model(**fields)
    return info.value.errors()[0], str(info.value)


def test_logprobs_that_do_not_match_the_response_ids_name_the_field():
    error, text = _error_of(
        LLMCall, call_id="c", prompt_ids=[1], response_ids=[1, 2, 3], response_logprobs=[-0.1, -0.2]
    )
    assert error["loc"] == ("response_logprobs",)
    assert "2 values for 3 response ids" in text and "response_logprobs" in text


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([1, "a"], "int32 token ids"),
        ([1.5], "int32 token ids"),
        ([2**31], "int32 token ids"),
        ("not base64!", "base64"),
        (b"\x01\x02\x03", "multiple of 4"),
        (7, "expected a list"),
    ],
    ids=["string-id", "float-id", "out-of-range", "bad-base64", "ragged-bytes", "scalar"],
)
def test_bad_token_ids_name_the_field_and_the_reason(value, reason):
    error, text = _error_of(LLMCall, call_id="c", prompt_ids=value, response_ids=[])
    assert error["loc"] == ("prompt_ids",)
    assert reason in text


def test_bad_logprobs_name_the_field():
    error, _ = _error_of(LLMCall, call_id="c", prompt_ids=[], response_ids=[1], response_logprobs=["high"])
    assert error["loc"] == ("response_logprobs",)
    error, _ = _error_of(
        Transition,
        rollout_id="r",
        task_id="t",
        step=0,
        prompt_ids=[1],
        response_ids=[1],
        response_logprobs=["x"],
        reward=0.0,
    )
    assert error["loc"] == ("response_logprobs",)


@pytest.mark.parametrize(
    ("model", "fields", "loc"),
    [
        (Rollout, {"task_id": "t", "max_attempts": 0}, "max_attempts"),
        (Rollout, {"task_id": "t", "timeout_s": -1}, "timeout_s"),
        (Rollout, {"task_id": "t", "status": "paused"}, "status"),
        (Rollout, {"task_id": "t", "mode": "debug"}, "mode"),
        (Rollout, {"task_id": ""}, "task_id"),
        (Rollout, {"task_id": "t", "colour": "red"}, "colour"),
        (Span, {"name": "s", "kind": "database"}, "kind"),
        (Span, {"name": "s", "status": "fine"}, "status"),
        (Reward, {"value": "lots"}, "value"),
        (Attempt, {"rollout_id": "r", "attempt": 0}, "attempt"),
        (
            Transition,
            {"rollout_id": "r", "task_id": "t", "step": -1, "prompt_ids": [], "response_ids": [], "reward": 0},
            "step",
        ),
        (
            Transition,
            {
                "rollout_id": "r",
                "task_id": "t",
                "step": 0,
                "prompt_ids": [],
                "response_ids": [],
                "reward": 0,
                "token_source": "vibes",
            },
            "token_source",
        ),
        (ModelVersion, {"version": ""}, "version"),
        (LLMCall, {"call_id": "", "prompt_ids": [], "response_ids": []}, "call_id"),
    ],
)
def test_bad_fields_are_named(model, fields, loc):
    error, text = _error_of(model, **fields)
    assert error["loc"][0] == loc
    assert loc in text


def test_special_floats_are_refused_at_the_edge():
    # NaN and infinity would reach SQL as NULL or break its JSON functions (issue 16).
    with pytest.raises(ValidationError, match="value"):
        Reward(value=float("nan"))
    with pytest.raises(ValidationError, match="attributes\n  at score: must be a finite number"):
        Span(name="s", attributes={"score": float("inf")})


def test_the_status_machine():
    Q, R, S, F, T, C = (
        RolloutStatus.QUEUED,
        RolloutStatus.RUNNING,
        RolloutStatus.SUCCEEDED,
        RolloutStatus.FAILED,
        RolloutStatus.TIMED_OUT,
        RolloutStatus.CANCELLED,
    )
    assert ALLOWED_TRANSITIONS[Q] == {R, C}
    assert ALLOWED_TRANSITIONS[R] == {S, F, T, C, Q}  # running → queued is a retry by policy
    for end in (S, F, T, C):
        assert ALLOWED_TRANSITIONS[end] == frozenset() and end.terminal
    assert {S, F, T, C} == TERMINAL_STATUSES
    assert not Q.terminal and not R.terminal
    assert set(ALLOWED_TRANSITIONS) == set(RolloutStatus)
    assert Q not in ALLOWED_TRANSITIONS[Q] and S not in ALLOWED_TRANSITIONS[Q]
    assert RolloutStatus("timed_out") is T


def test_transition_logprobs_must_match_the_response_ids():
    from agl.schema import Transition

    with pytest.raises(ValidationError, match="response_logprobs"):
        Transition(
            rollout_id="r",
            task_id="t",
            step=0,
            prompt_ids=[1],
            response_ids=[1, 2],
            response_logprobs=[-0.1],
            reward=1.0,
        )


def test_ids_made_by_one_process_increase_even_within_a_millisecond():
    from agl.schema import new_id

    ids = [new_id("ro-") for _ in range(5000)]  # thousands land in the same millisecond
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == len("ro-") + 32 for i in ids)


def test_an_id_is_a_ulid_whose_clock_is_the_time_it_was_made():
    import time

    from ulid import ULID

    from agl.schema import new_id

    before = time.time()
    made = ULID.from_hex(new_id("rw-").removeprefix("rw-"))
    assert before - 0.001 <= made.timestamp <= time.time()


def test_ids_keep_increasing_when_the_clock_steps_back(monkeypatch):
    import time

    from agl.schema import new_id

    start = time.time_ns() + 10**12
    first = new_id()
    monkeypatch.setattr(time, "time_ns", lambda: start)
    later = new_id()
    monkeypatch.setattr(time, "time_ns", lambda: start - 5 * 10**9)  # five seconds back
    stepped_back = [new_id() for _ in range(100)]
    assert [first, later, *stepped_back] == sorted([first, later, *stepped_back])
    assert all(i[:12] == later[:12] for i in stepped_back)


def test_ids_from_threads_are_unique():
    import threading

    from agl.schema import new_id

    made: list[list[str]] = [[] for _ in range(8)]
    threads = [threading.Thread(target=lambda out=out: out.extend(new_id() for _ in range(2000))) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every)
    assert all(out == sorted(out) for out in made)


def test_a_forked_child_does_not_repeat_its_parents_ids(monkeypatch):
    import os
    import time

    from agl.schema import new_id

    # Both processes in one millisecond, so only the child's fresh start keeps them apart.
    frozen = time.time_ns() + 10**12
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    new_id()  # the parent's clock has state to inherit
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids and leave at once
        os.write(write, " ".join(new_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    parent = {new_id() for _ in range(50)}
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    assert len(child) == 50
    assert not parent & child


# -- token checks on the packed bytes (issue 32: checks that cost little) ----------------------
def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@pytest.mark.parametrize(
    ("ids", "bad_at"),
    [
        ([0, 1, 2**31 - 1, 255, 256, 2**24], None),  # every byte value below the sign bit, the largest id
        ([5, -1], 1),
        ([-(2**31), 7], 0),
        ([2**23, 2**24 - 1, -256], 2),
    ],
)
def test_token_ids_are_checked_for_sign_however_they_come(ids, bad_at):
    packed = struct.pack(f"<{len(ids)}i", *ids)
    for given in (ids, array("i", ids), packed, base64.b64encode(packed).decode()):
        if bad_at is None:
            assert list(LLMCall(call_id="c", prompt_ids=given, response_ids=[]).prompt_ids) == ids
        else:
            _, text = _error_of(LLMCall, call_id="c", prompt_ids=given, response_ids=[])
            assert f"token ids are non-negative: [{bad_at}] is {ids[bad_at]}" in text


@pytest.mark.parametrize(
    ("bits", "finite"),
    [
        (0x7F7FFFFF, True),  # the largest float32: exponent byte 0x7f with its last bit clear
        (0xFF7FFFFF, True),  # the most negative one
        (0x7F000000, True),  # 2**127
        (0xC61C3C00, True),  # -9999, the gateway's floor
        (0x00000001, True),  # the smallest subnormal
        (0x7F800000, False),  # +inf
        (0xFF800000, False),  # -inf
        (0x7FC00000, False),  # the usual NaN
        (0xFF800001, False),  # a NaN with a payload and the sign set
    ],
)
def test_logprobs_are_checked_for_finiteness_on_their_bits(bits, finite):
    values = [-0.5, _f32(bits), -0.25]
    packed = struct.pack("<3I", 0xBF000000, bits, 0xBE800000)
    for given in (packed, base64.b64encode(packed).decode(), array("f", values)):
        fields = {"call_id": "c", "prompt_ids": [1], "response_ids": [1, 2, 3], "response_logprobs": given}
        if finite:
            assert list(LLMCall(**fields).response_logprobs) == values
        else:
            error, text = _error_of(LLMCall, **fields)
            assert error["loc"] == ("response_logprobs",) and "logprobs are finite numbers: [1]" in text


def test_records_a_store_wrote_are_read_back_without_checking_again():
    row = {"call_id": "c", "prompt_ids": [-3], "response_ids": [1], "response_logprobs": [math.nan]}
    row["request"] = {"deep": [[[float("inf")]]]}
    with pytest.raises(ValidationError):
        LLMCall.model_validate(row)
    call = LLMCall.model_validate(row, context=STORED)  # what a store reads back of its own
    assert call.prompt_ids[0] == -3 and math.isnan(call.response_logprobs[0])
    # a check that belongs to the record's shape, not its values, still holds on a read
    with pytest.raises(ValidationError, match="response_logprobs"):
        LLMCall.model_validate(row | {"response_ids": []}, context=STORED)
