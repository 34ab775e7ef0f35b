"""``agl.capture.spans.finished_span``: the span ``Span(...)`` makes, or its error, made without the validator.

Each case is made both ways and compared: what the instance holds, how it dumps (Python and
JSON), its fields set, and for refused values the error, message for message. Real SQLite store
and writer for the round trip.
"""

from __future__ import annotations

import collections
import copy
import enum
import math
import pickle
import random
import time

import pytest
from pydantic import ValidationError

from agl.capture import BufferedWriter
from agl.capture import spans as spans_module
from agl.capture.spans import finished_span
from agl.schema import INT64_MAX, INT64_MIN, MAX_JSON_DEPTH, Span, json_problem
from agl.store.sqlite import SqliteStore

_ORDER = (
    "span_id",
    "trace_id",
    "parent_id",
    "rollout_id",
    "seq",
    "name",
    "kind",
    "start_time",
    "end_time",
    "status",
    "attributes",
)


def _base() -> dict:
    return {
        "span_id": "3f8c0a2e-1111-2222-3333-444455556666",
        "trace_id": "01JTRACE",
        "parent_id": None,
        "rollout_id": "ro-1",
        "seq": 3,
        "name": "ChatOpenAI",
        "kind": "llm",
        "start_time": 1700000000.25,
        "end_time": 1700000000.5,
        "status": "ok",
        "attributes": {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": [{"role": "user", "content": "2 + 3? 東京"}],
            "gen_ai.output.messages": [{"role": "assistant", "content": "5", "finish_reason": "stop"}],
            "gen_ai.usage.input_tokens": 12,
            "gen_ai.request.temperature": 0.7,
            "nested": {"a": [1, 2.5, None, True, {"b": "c"}]},
        },
    }


def _both(fields: dict) -> tuple[object, object]:
    """``(what Span(...) gives, what finished_span gives)``: a span or the error, each way."""
    results = []
    for make in (lambda f: Span(**copy.deepcopy(f)), lambda f: finished_span(*(copy.deepcopy(f)[k] for k in _ORDER))):
        try:
            results.append(make(fields))
        except ValidationError as exc:
            results.append(exc)
    return results[0], results[1]


def _same(expected: object, got: object) -> None:
    if isinstance(expected, ValidationError):
        assert isinstance(got, ValidationError), got
        assert got.errors(include_url=False) == expected.errors(include_url=False)
        return
    assert isinstance(got, Span) and isinstance(expected, Span)
    assert got == expected
    assert got.model_dump() == expected.model_dump()
    assert got.model_dump_json() == expected.model_dump_json()
    assert got.model_fields_set == expected.model_fields_set
    assert got.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)
    assert {k: type(v) for k, v in got.__dict__.items()} == {k: type(v) for k, v in expected.__dict__.items()}


def test_the_shortcut_holds_for_the_span_model_as_it_is():
    # A field, validator or private attribute added to Span turns the shortcut off (every span then
    # goes through Span(...)); this test says so, so that the cases below are looked at again.
    assert spans_module.SHORTCUT
    assert tuple(Span.model_fields) == _ORDER


def test_a_span_of_plain_values_is_the_one_span_makes():
    _same(*_both(_base()))
    _same(*_both(_base() | {"parent_id": "parent", "rollout_id": None, "end_time": None, "attributes": {}}))
    for kind in ("llm", "tool", "agent", "reward", "custom"):
        for status in ("ok", "error", "unset"):
            _same(*_both(_base() | {"kind": kind, "status": status}))


EDGES = [
    ("span_id", ""),
    ("span_id", None),
    ("span_id", 5),
    ("trace_id", ""),
    ("trace_id", b"bytes"),
    ("parent_id", ""),
    ("parent_id", 7),
    ("rollout_id", ["ro"]),
    ("seq", INT64_MAX),
    ("seq", INT64_MIN),
    ("seq", INT64_MAX + 1),
    ("seq", INT64_MIN - 1),
    ("seq", 3.0),
    ("seq", True),
    ("seq", "4"),
    ("name", ""),
    ("name", None),
    ("name", 12),
    ("kind", "span"),
    ("kind", None),
    ("kind", "LLM"),
    ("start_time", 5),
    ("start_time", math.nan),
    ("start_time", math.inf),
    ("start_time", "1.5"),
    ("end_time", -math.inf),
    ("end_time", 2),
    ("status", "done"),
    ("status", None),
    ("attributes", None),
    ("attributes", []),
    ("attributes", {1: "int key"}),
    ("attributes", {"score": math.nan}),
    ("attributes", {"deep": {"scores": [0.5, math.inf]}}),
    ("attributes", {"big": INT64_MAX + 1}),
    ("attributes", {"big": [INT64_MIN - 1]}),
    ("attributes", {"ok": INT64_MIN, "also": INT64_MAX, "t": (1.5, None)}),
    ("attributes", {"other": frozenset({1, 2})}),  # not JSON's: serialising decides, as for Span
]


@pytest.mark.parametrize(("field", "value"), EDGES, ids=[f"{f}={v!r}"[:40] for f, v in EDGES])
def test_each_edge_of_each_field_gives_what_span_gives(field, value):
    _same(*_both(_base() | {field: value}))


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
def test_nesting_at_the_depth_limit_gives_what_span_gives(depth):
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    _same(*_both(_base() | {"attributes": {"nest": value}}))


def test_a_refused_span_names_the_field_and_the_place():
    with pytest.raises(ValidationError, match=r"attributes\n.*deep\.scores\[1\].*finite"):
        finished_span(*(_base() | {"attributes": {"deep": {"scores": [0.5, math.inf]}}}).values())


def test_the_span_behaves_as_any_span_afterwards():
    one = finished_span(*_base().values())
    other = finished_span(*(_base() | {"span_id": "other"}).values())
    one.status = "error"  # pydantic adds the name to the fields set: no change there, one set for all
    assert one.status == "error" and other.status == "ok"
    assert one.model_fields_set == set(_ORDER) == other.model_fields_set
    updated = one.model_copy(update={"name": "renamed"})
    assert updated.name == "renamed" and one.name == "ChatOpenAI"
    assert updated.model_fields_set == set(_ORDER) and one.model_fields_set == set(_ORDER)
    assert pickle.loads(pickle.dumps(one)) == one
    assert copy.deepcopy(one) == one
    assert Span.model_validate_json(one.model_dump_json()) == one


@pytest.mark.parametrize("pack_after", [None, 0])
def test_made_spans_round_trip_through_the_writer_and_store(tmp_path, pack_after):
    store = SqliteStore(tmp_path / "agl.db")
    writer = BufferedWriter(store, pack_after=pack_after)
    made = [
        finished_span(*(_base() | {"span_id": f"s{i}", "seq": i, "end_time": time.time()}).values()) for i in range(5)
    ]
    for s in made:
        writer.put(s)
    writer.close()
    assert list(store.query_spans(rollout_id="ro-1")) == made
    store.close()


class _Level(enum.IntEnum):
    HIGH = 2**70  # an int subclass: not JSON's int, so neither walk looks at its range


class _Ratio(float):
    pass


def _value(rng: random.Random, depth: int) -> object:
    """A random value of the kinds attributes hold, nested up to past the depth limit."""
    leaves = [
        "text",
        "",
        None,
        True,
        False,
        0,
        -1,
        INT64_MAX,
        INT64_MIN,
        INT64_MAX + 1,
        INT64_MIN - 1,
        2**100,
        0.5,
        -0.0,
        1e308,
        math.nan,
        math.inf,
        -math.inf,
        _Level.HIGH,
        _Ratio("nan"),
        b"bytes",
        collections.OrderedDict(a=math.nan),  # a dict subclass: neither walk goes in
    ]
    roll = rng.random()
    if depth < MAX_JSON_DEPTH + 2 and roll < 0.45:
        n = rng.randrange(4)
        if roll < 0.15:
            return {f"k{i}": _value(rng, depth + 1) for i in range(n)}
        items = [_value(rng, depth + 1) for _ in range(n)]
        return items if roll < 0.35 else tuple(items)
    return rng.choice(leaves)


def test_the_attributes_walk_accepts_exactly_what_check_json_accepts():
    rng = random.Random(46)
    verdicts = collections.Counter()
    for case in range(20_000):
        deep = rng.random() < 0.05
        value: object = {"a": _value(rng, 0), "b": _value(rng, 0)}
        if deep:  # a chain to just around the limit, then random below it
            for _ in range(rng.randrange(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 2)):
                value = [value]
            value = {"deep": value}
        expected = json_problem(value) is None
        assert spans_module._plain_json(value, 0) is expected, (case, value)
        verdicts[expected] += 1
    assert min(verdicts.values()) > 2_000  # both verdicts well represented
