"""An engine's answer is read as the standard library reads it, by pydantic-core's parser where
that is faster (:func:`agl_trainer.gateway.chat.engine_json`): the same values of the same types
for every text, the standard parser's own error for a text neither takes."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest

from agl_trainer.gateway import chat, json_codec
from tests.fake_engine import FakeEngine

USER = {"role": "user", "content": "What is the capital of France? \u00e9\u4e2d\U0001f600"}


def reference(raw: bytes):
    """What the gateway read before the fast parser: the standard library, non-finite constants made finite."""
    return json.loads(raw, parse_constant=chat._constant)


def typed(value):
    """``value`` with each number's type beside it (1 and 1.0 compare equal; a record keeps them apart)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))  # keeps -0.0 apart from 0.0, and NaN comparable
    return (type(value).__name__, value)


def same_reading(raw: bytes) -> None:
    try:
        expected = typed(reference(raw))
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)) as got:
            chat.engine_json(raw)
        assert str(got.value) == str(exc)
        return
    assert typed(chat.engine_json(raw)) == expected


def engine_answers() -> list[bytes]:
    """The fake engine's chat and text answers as it sends them: with logprobs, n > 1, tool calls."""
    engine = FakeEngine()
    bodies = [
        {"messages": [USER], "logprobs": True, "top_logprobs": 2, "return_token_ids": True},
        {"messages": [USER], "n": 3, "logprobs": True, "return_token_ids": True},
        {
            "messages": [{"role": "user", "content": "call lookup"}],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
            "return_token_ids": True,
        },
    ]
    answers = [engine.chat({"model": "m", **body})[1] for body in bodies]
    answers.append(engine.completion({"model": "m", "prompt": "one two", "logprobs": 1, "return_token_ids": True})[1])
    return [json.dumps(a).encode() for a in answers]


@pytest.mark.parametrize("raw", engine_answers())
def test_an_engine_answer_reads_as_the_standard_library_reads_it(raw):
    same_reading(raw)


EDGES = [
    b'{"logprob": -Infinity, "top": [NaN, Infinity]}',  # Python's json writes these; the fast parser refuses them
    b"[1e400, -1e400, 1e-400]",  # past a float's range: inf from the standard parser
    b"[123456789012345678901234567890, -9223372036854775809]",  # past 64 bits: ints (orjson: floats)
    b"[18446744073709551615, -9223372036854775808, 9223372036854775807, 1234567890123456789]",
    b"[-0.0074062875554280995, -0.00033551786327734590001]",  # long fractions
    b'["\\ud800", "\\udfff x", "\\ud83d\\ude00"]',  # lone surrogates, escaped; a pair
    b'["\xed\xa0\x80"]',  # a lone surrogate in raw bytes (not UTF-8)
    b'\xef\xbb\xbf{"a": 1}',  # a byte order mark
    '{"a": "\u00e9"}'.encode("utf-16"),  # not UTF-8 at all
    b'{"a": 1, "a": 2}',  # the last of a duplicated key wins
    b"[-0.0, 0.0, -0, 5e-324, 1.7976931348623157e308, 0.30000000000000004, 9007199254740993]",
    b'{"a": [1, 2.5, true, false, null, "x\\u0000\\n\\t\\"\\\\"]}',
    b"[" * 3000 + b"]" * 3000,  # deeper than either parser goes
    b"[" * 200 + b"]" * 200,
    b'["a\nb"]',  # a raw control character
    b"[01]",
    b"[1,]",
    b'["\xff"]',  # not UTF-8
    b"",
    b"[1] [2]",
]


@pytest.mark.parametrize("raw", EDGES)
def test_every_text_the_fast_parser_reads_otherwise_goes_to_the_standard_parser(raw):
    same_reading(raw)


def random_numbers(rng: random.Random, count: int) -> list[str]:
    """Number literals the fast parser reads: any double by its repr, logprob-like values, decimal
    texts of up to 30 digits, integers within and past 64 bits."""
    numbers = []
    for _ in range(count):
        kind = rng.randrange(4)
        if kind == 0:
            value = struct.unpack("<d", rng.randbytes(8))[0]
            numbers.append(repr(value) if math.isfinite(value) else "0.5")
        elif kind == 1:
            numbers.append(repr(-rng.expovariate(0.5)))
        elif kind == 2:
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(2, 31)))
            point = rng.randrange(1, len(digits))
            numbers.append(f"{rng.choice(['', '-'])}{int(digits[:point])}.{digits[point:]}e{rng.randrange(-300, 300)}")
        else:
            numbers.append(str(rng.randrange(-(2**70), 2**70)))
    return numbers


def test_random_numbers_read_the_same(monkeypatch):
    raw = ("[" + ", ".join(random_numbers(random.Random(46), 5000)) + "]").encode()
    same_reading(raw)
    monkeypatch.setattr(json_codec.json, "loads", refuse)
    chat.engine_json(raw)  # and the fast parser read them


def test_numbers_past_64_bits_stay_integers():
    """The store refuses an integer past 64 bits (:func:`agl.schema.check_json`): it must not turn
    into a float it would keep (as orjson reads it)."""
    rng = random.Random(64)
    for _ in range(200):
        raw = f'{{"usage": {{"total_tokens": {rng.choice([-1, 1]) * rng.randrange(2**64, 2**80)}}}}}'.encode()
        same_reading(raw)
        assert isinstance(chat.engine_json(raw)["usage"]["total_tokens"], int)


def refuse(*args, **kwargs):
    raise AssertionError("the standard parser read an answer the fast parser reads the same")


def test_an_engine_answer_is_read_by_the_fast_parser(monkeypatch):
    """The fast path is taken for the usual answer (else the gateway is 40 us a call slower, silently)."""
    monkeypatch.setattr(json_codec.json, "loads", refuse)
    for raw in engine_answers():
        assert chat.engine_json(raw)["choices"]


def test_a_text_chunk_of_a_stream_still_reads():
    """A stream's events come as text: read by the standard parser, as before."""
    assert chat.engine_json('{"logprob": -Infinity, "n": NaN}') == {"logprob": chat.LOGPROB_FLOOR, "n": None}
