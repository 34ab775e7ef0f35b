"""A finished span made on the capture path: :class:`agl.Span`'s checks, without its validator's pass.

An integration's callback builds one span per run it watches, on the agent's thread, and
``Span(...)`` was the largest part of the LangChain handler's own cost: pydantic's validation of
the eleven fields, where the span's values, made by the integration, are already of the types the
model keeps. :func:`finished_span` checks each value as the model's schema does (the exact type,
``min_length`` of the ids, ``seq`` within 64 bits, the ``kind`` and ``status`` literals, finite
times, string keys, and the attributes walked as :func:`agl.schema.check_json` walks them: finite
floats, 64-bit integers, at most :data:`~agl.schema.MAX_JSON_DEPTH` deep) and makes the instance
as pydantic's own ``model_construct`` does (its ``__dict__``, the fields set, no extra, no private
values). A value it does not accept as it stands (another type pydantic might convert, or one it
refuses) goes through ``Span(...)``, which converts it or raises the model's own error: the span
is the one ``Span(...)`` makes, or the error is. Every span made here shares one fields set (all
eleven names): pydantic only adds a name to it on assignment, which changes nothing there, and
copies it for a copy; a set of its own cost 0.9 µs and 0.7 KB a span.

What it saves, same run (``Span(...)``, ``Span.model_construct`` and :func:`finished_span` on a
LangChain chat-model call's span: a system and a user message in, one message out; thread CPU
time, best and median of 9 blocks of 20,000, Python 3.11, pydantic 2.14, 2026-11-29 19:14, load
average 5.6-5.8 on 2 shared cores): 6.38 / 7.55 µs, 5.13 / 5.67 and 3.03 / 3.08; again 6.27 /
7.27, 5.00 / 5.64 and 2.97 / 3.09. ``model_construct``, pydantic's supported way to skip
validation, is no help (and checks nothing). The shortcut holds while :data:`SHORTCUT` is true:
``Span`` has exactly the fields below, no validators besides the attributes' JSON check (an
``Annotated`` one, which the walk here stands for), no private attributes and no
``model_post_init`` (checked at import). Tests pin it, compare the two ways field by field at
every edge (the errors too), and compare the walk with :func:`agl.schema.json_problem` on 20,000
random values.
"""

from __future__ import annotations

from typing import Any, get_args

from agl.schema import INT64_MAX, INT64_MIN, MAX_JSON_DEPTH, Span, SpanKind

_FIELDS = (
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
_KINDS = frozenset(get_args(SpanKind))
_STATUSES = frozenset(get_args(Span.model_fields["status"].annotation))
_ALL_SET = set(_FIELDS)
"""The fields set of every span made here (all of them): one set for all such spans, never changed,
since pydantic only ever adds a field's name to it (on assignment) and copies it for a copy."""
_STR = frozenset({str})


def _shortcut_holds() -> bool:
    decorators = Span.__pydantic_decorators__
    return (
        tuple(Span.model_fields) == _FIELDS
        and not Span.__private_attributes__
        and Span.__pydantic_post_init__ is None
        and Span.model_config.get("extra") == "forbid"
        and not decorators.validators
        and not decorators.field_validators
        and not decorators.model_validators
        and not decorators.root_validators
    )


SHORTCUT = _shortcut_holds()
"""Whether :func:`finished_span` may make spans itself; False sends every span through ``Span(...)``."""

_new = object.__new__
_set = object.__setattr__


def _plain_json(value: dict[str, Any] | list[Any] | tuple[Any, ...], depth: int) -> bool:
    """Whether :func:`agl.schema.check_json` accepts the container ``value`` (nested ``depth`` deep):
    the same walk, telling only yes or no (where it fails, ``Span(...)`` says why)."""
    if depth >= MAX_JSON_DEPTH:
        return False
    for item in value.values() if type(value) is dict else value:
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is dict or kind is list or kind is tuple:
            if not _plain_json(item, depth + 1):
                return False
        elif kind is float:
            if item - item != 0.0:  # inf - inf and nan - nan are nan
                return False
        elif kind is int and not INT64_MIN <= item <= INT64_MAX:
            return False
    return True


def finished_span(
    span_id: str,
    trace_id: str,
    parent_id: str | None,
    rollout_id: str | None,
    seq: int,
    name: str,
    kind: SpanKind,
    start_time: float,
    end_time: float | None,
    status: str,
    attributes: dict[str, Any],
) -> Span:
    """``Span(span_id=..., ..., attributes=...)``: the same span, or the same error, for less.

    ``attributes`` becomes the span's own (not copied, as validation would): the caller hands it over.
    """
    # Whether ``Span(...)`` would keep each value as it is (so that making the span directly gives the same).
    if (
        SHORTCUT
        and type(span_id) is str
        and span_id != ""
        and type(trace_id) is str
        and trace_id != ""
        and (parent_id is None or type(parent_id) is str)
        and (rollout_id is None or type(rollout_id) is str)
        and type(seq) is int
        and INT64_MIN <= seq <= INT64_MAX
        and type(name) is str
        and type(kind) is str
        and kind in _KINDS
        and type(start_time) is float
        and start_time - start_time == 0.0  # finite: inf - inf and nan - nan are nan
        and (end_time is None or (type(end_time) is float and end_time - end_time == 0.0))
        and type(status) is str
        and status in _STATUSES
        and type(attributes) is dict
        and {*map(type, attributes)} <= _STR  # string keys
        and _plain_json(attributes, 0)
    ):
        span = _new(Span)
        _set(
            span,
            "__dict__",
            {
                "span_id": span_id,
                "trace_id": trace_id,
                "parent_id": parent_id,
                "rollout_id": rollout_id,
                "seq": seq,
                "name": name,
                "kind": kind,
                "start_time": start_time,
                "end_time": end_time,
                "status": status,
                "attributes": attributes,
            },
        )
        _set(span, "__pydantic_fields_set__", _ALL_SET)
        _set(span, "__pydantic_extra__", None)
        _set(span, "__pydantic_private__", None)
        return span
    return Span(
        span_id=span_id,
        trace_id=trace_id,
        parent_id=parent_id,
        rollout_id=rollout_id,
        seq=seq,
        name=name,
        kind=kind,
        start_time=start_time,
        end_time=end_time,
        status=status,
        attributes=attributes,
    )
