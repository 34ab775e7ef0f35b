"""Stores: where runners, the gateway and trainers meet."""

from agl.store.base import Store
from agl.store.openers import open_store

__all__ = ["Store", "open_store"]
