"""The gateway's JSON codec (:mod:`agl_trainer.gateway.json_codec`): the values and errors of the
standard library's ``json``, whichever parser or writer did the work."""

from __future__ import annotations

import json
import math

import pytest

from agl_trainer.gateway import json_codec

TEXTS = [
    b'{"a":1,"a":2}',  # the last of repeated keys
    b'{"a":1e400,"b":-1e400}',  # infinities by overflow, not literals
    b'{"a":123456789012345678901234567890,"b":-0,"c":-0.0,"d":1E2}',
    b'{"a":1.0000000000000002,"b":0.1,"c":5e-324,"d":2.2250738585072014e-308}',
    b'{"s":"\\u00e9\\u2028\\ud83d\\ude00\\u0000"}',  # escapes, a surrogate pair, NUL
    '{"s":"é😀"}'.encode(),
    '{"s":"é"}',  # a str, not bytes
    b"  [1, 2.5, true, false, null]  ",
    # what pydantic-core refuses, and json.loads reads:
    b'{"a":NaN,"b":Infinity,"c":-Infinity}',
    b'{"a":"\\ud800"}',  # a lone surrogate, by escape
    b'{"a":"\xed\xa0\x80"}',  # and by its bytes
    b'\xef\xbb\xbf{"a":1}',  # a byte order mark
    '{"a":"é"}'.encode("utf-16"),  # UTF-16
    b"[" * 300 + b"]" * 300,  # past pydantic-core's nesting limit
]


def _same(a, b) -> bool:
    """Equal as JSON values, NaN included, and of the same types throughout."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


@pytest.mark.parametrize("text", TEXTS)
def test_parse_gives_what_json_loads_gives(text):
    assert _same(json_codec.parse(text), json.loads(text))


def test_parse_hands_its_constants_to_parse_constant():
    assert json_codec.parse(b'{"a":-Infinity,"b":NaN}', lambda name: name) == {"a": "-Infinity", "b": "NaN"}


@pytest.mark.parametrize("text", [b'{"a":1} x', b'{"a":', b"", b'{"a":tru}', b"[" * 5000 + b"]" * 5000])
def test_parse_refuses_as_json_loads_does(text):
    with pytest.raises((ValueError, RecursionError)) as expected:
        json.loads(text)
    with pytest.raises(type(expected.value)) as got:
        json_codec.parse(text)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("text", TEXTS[:8])
def test_dump_writes_the_same_values_as_json_dumps(text):
    value = json.loads(text)
    written = json_codec.dump(value)
    assert isinstance(written, bytes)
    assert _same(json.loads(written), json.loads(json.dumps(value)))


def test_dump_writes_what_pydantic_core_will_not_as_json_dumps_does():
    lone = {"a": "x\ud800y"}
    assert json_codec.dump(lone) == json.dumps(lone).encode()  # escaped: \ud800
    deep: list = []
    inner = deep
    for _ in range(600):
        inner.append([])
        inner = inner[0]
    assert json_codec.dump(deep) == json.dumps(deep).encode()
