"""Packed token arrays.

Token ids and logprobs travel and rest as packed little-endian bytes (int32 for ids,
float32 for logprobs), never as JSON lists of numbers. In Python they are
``array.array`` objects, which unpack from bytes with a single copy.

In JSON they are base64 strings. Validation also accepts plain lists, bytes and
base64 strings, so callers can pass whatever they hold, and checks the values however they
came: token ids are non-negative, logprobs finite (a float32 past its range, ``1e309`` in
JSON, is infinite: refused too). The checks read the packed bytes (a sign or exponent byte
of each value), so they cost about a microsecond an array; records a store wrote itself
were checked when written and are read back unchecked (:data:`STORED`).
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator, ValidationInfo, WithJsonSchema

_SWAP = sys.byteorder != "little"

STORED: dict[str, bool] = {"agl_stored": True}
"""The validation context of a record a store reads back from its own tables (or a store server
answers with): it was checked when written, so its token arrays and JSON fields are not checked
again, e.g. ``LLMCall.model_validate(row, context=STORED)``. Nothing from outside is validated
with it."""
_HIGH_BYTE = bytes(range(256)).translate(bytes(range(128)) * 2)  # each byte with its top bit cleared


def _from_bytes(typecode: str, raw: bytes | bytearray | memoryview) -> array:
    values = array(typecode)
    if len(raw) % values.itemsize:
        raise ValueError(f"packed length {len(raw)} is not a multiple of {values.itemsize} bytes")
    values.frombytes(raw)
    if _SWAP:
        values.byteswap()
    return values


def to_bytes(values: array) -> bytes:
    """Pack an array as little-endian bytes."""
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _coerce(typecode: str, value: Any) -> array:
    if isinstance(value, array):
        return value if value.typecode == typecode else array(typecode, value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _from_bytes(typecode, value)
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except ValueError as exc:
            raise ValueError("expected a base64 string of packed values") from exc
        return _from_bytes(typecode, raw)
    if isinstance(value, (list, tuple)):
        try:
            return array(typecode, value)
        except (TypeError, OverflowError) as exc:
            kind = "int32 token ids" if typecode == "i" else "float logprobs"
            raise ValueError(f"expected a list of {kind}: {exc}") from exc
    raise ValueError(f"expected a list, bytes or base64 string, got {type(value).__name__}")


def _b64(values: array) -> str:
    return base64.b64encode(to_bytes(values)).decode("ascii")


def int32_array(value: Any) -> array:
    """Coerce ``value`` (list, bytes, base64 or array) into an int32 array."""
    return _coerce("i", value)


def float32_array(value: Any) -> array:
    """Coerce ``value`` (list, bytes, base64 or array) into a float32 array."""
    return _coerce("f", value)


def stored(info: ValidationInfo) -> bool:
    """Whether a validator runs on a record a store wrote itself (see :data:`STORED`)."""
    return info.context is STORED


def _token_ids(value: Any, info: ValidationInfo) -> array:
    values = int32_array(value)
    # a negative int32 has the top bit of its last little-endian byte set
    if values and not stored(info) and not to_bytes(values)[3::4].isascii():
        at = next(i for i, v in enumerate(values) if v < 0)
        raise ValueError(f"token ids are non-negative: [{at}] is {values[at]}")
    return values


def _logprobs(value: Any, info: ValidationInfo) -> array:
    values = float32_array(value)
    # a float32 is a NaN or an infinity when all 8 bits of its exponent are set: 7 of them are the
    # last little-endian byte but its sign; where that is 0x7f somewhere, each value is looked at
    if values and not stored(info) and b"\x7f" in to_bytes(values)[3::4].translate(_HIGH_BYTE):
        at = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if at is not None:
            raise ValueError(f"logprobs are finite numbers: [{at}] is {values[at]}")
    return values


TokenIds = Annotated[
    array,
    PlainValidator(_token_ids),
    PlainSerializer(_b64, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "contentEncoding": "base64", "description": "int32 little-endian"}),
]
"""Token ids: an int32 ``array.array`` of non-negative ids; base64 of little-endian bytes in JSON."""

Logprobs = Annotated[
    array,
    PlainValidator(_logprobs),
    PlainSerializer(_b64, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "contentEncoding": "base64", "description": "float32 little-endian"}),
]
"""Logprobs: a float32 ``array.array`` of finite numbers; base64 of little-endian bytes in JSON."""
