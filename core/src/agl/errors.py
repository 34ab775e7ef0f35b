"""Exceptions agl raises on purpose. Each names what was wrong and why."""

from __future__ import annotations


class AglError(Exception):
    """Base class for every error agl raises on purpose."""


class NotFound(AglError, KeyError):
    """An id that the store does not know."""

    def __init__(self, kind: str, ident: str):
        self.kind = kind
        self.ident = ident
        super().__init__(f"unknown {kind} {ident!r}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class InvalidTransition(AglError, ValueError):
    """A rollout status change that the status machine does not allow."""


class IdConflict(AglError, ValueError):
    """A span, LLM call or reward whose id belongs to another rollout: stored already under
    another rollout, or of the form agl gives a rollout's own rewards (``rw-<rollout>-a<attempt>-…``)
    naming another. Ids are owned by their rollout; the write is refused (409), never dropped
    silently. Names the id, never the rollout that owns it."""

    def __init__(self, field: str, ident: str, reason: str = "belongs to another rollout"):
        self.field = field
        self.ident = ident
        super().__init__(f"{field}: id {ident!r} {reason}")


class Transient(AglError):
    """A failure that may pass if the same call is tried again later: the store or a server
    away, overloaded or failing inside. :mod:`agl.retry` retries these (and only by type)."""


class StoreUnavailable(Transient):
    """The store could not be reached, or stayed locked, after retries."""


class Refused(AglError):
    """A server refused a request for good (a 4xx that no other class names): trying it again
    gets the same answer."""


class IncompatibleStore(AglError):
    """A database written by another version of agl, whose tables this version cannot use."""


class ConfigError(AglError, ValueError):
    """A configuration value that is missing or out of range; names the field."""
