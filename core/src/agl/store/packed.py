"""A span held in the form its store writes it, for a writer whose store is behind.

A :class:`~agl.capture.BufferedWriter` keeps every span it was given until its store has
written it. A span's objects (the pydantic model, its attribute dicts and their messages)
take about 2.4 KB for a LangChain chat-model call; the row a SQL store inserts for it (its
JSON body and a few columns) about 1 KB. A store that offers ``pack_span`` (the SQL stores)
turns a waiting span into a :class:`PackedSpan`, and its ``add_spans`` takes one as it takes
the span: the row it would have made from it, made earlier.
"""

from __future__ import annotations

import json
from typing import Any

from agl.schema import Span
from agl.tokens import STORED


class PackedSpan:
    """A span as its store's row: what the store inserts for it, and what a writer counts it by.

    ``body`` is the span's JSON (the store's body column); :meth:`span` gives the span back.
    """

    __slots__ = ("body", "name", "rollout_id", "row", "span_id")

    def __init__(self, span: Span, body: str, row: tuple[Any, ...]):
        self.span_id = span.span_id
        self.rollout_id = span.rollout_id
        self.name = span.name
        self.body = body
        self.row = row
        """What the store that packed it inserts (that store's layout)."""

    def span(self) -> Span:
        """The span this was packed from (read back from its JSON, as a store reads its own)."""
        try:
            return Span.model_validate_json(self.body, context=STORED)
        except ValueError:  # one built without validation (``model_construct``) may hold what it refuses
            return Span.model_construct(**json.loads(self.body))

    def __repr__(self) -> str:
        return f"PackedSpan(span_id={self.span_id!r}, rollout_id={self.rollout_id!r}, name={self.name!r})"
