"""Which replica serves a request.

A rollout sticks to the replica that served its first call, so a multi-turn
agent keeps hitting the engine that holds its prefix in cache. Requests with no
rollout, and rollouts whose replica is full or down, go to the replica with the
fewest requests in flight. A replica that refused a connection or answered 502/503
is tried last for a few seconds, and the request is retried on another one. When
every replica is at ``max_in_flight``, the request is refused (429).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict

from agl_trainer.gateway.errors import Saturated, UpstreamUnavailable
from agl_trainer.gateway.upstream import ConnectionPool, Endpoint, UpstreamConnectError, UpstreamResponse

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503})
_DOWN_FOR_S = 2.0


class Replica:
    """One engine server and what the gateway knows of it."""

    __slots__ = ("down_until", "endpoint", "in_flight", "max_model_len", "models", "pool", "served_model")

    def __init__(self, url: str, *, api_key: str | None = None, connect_timeout_s: float = 5.0):
        self.endpoint = Endpoint.parse(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.pool = ConnectionPool(self.endpoint, connect_timeout_s=connect_timeout_s, headers=headers)
        self.in_flight = 0
        self.models: list[str] = []
        self.served_model: str | None = None
        self.max_model_len: int | None = None
        self.down_until = 0.0

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def fetch_models(self, prefer: str | None = None) -> str | None:
        """Ask the replica what it serves (``GET /models``).

        The served model is ``prefer`` (the current model version) when the replica
        lists it, as an engine serving each version under its own name does, else the
        first model listed.
        """
        resp = await self.pool.request("GET", "/models")
        body = await resp.read()
        if resp.status != 200:
            raise UpstreamConnectError(f"{self.url}/models answered {resp.status}")
        data = json.loads(body).get("data") or []
        self.models = [m.get("id") for m in data if isinstance(m, dict) and m.get("id")]
        if data:
            chosen = next((m for m in data if m.get("id") == prefer), data[0])
            self.served_model = chosen.get("id")
            self.max_model_len = chosen.get("max_model_len")
        return self.served_model


class Router:
    """Picks replicas, tracks load, retries transient failures."""

    def __init__(
        self, upstreams: list[str], *, max_in_flight: int = 512, api_key: str | None = None, max_sticky: int = 100_000
    ):
        # None at first is allowed: replicas registered later through POST /admin/upstreams
        # (agl_verl's distributed mode registers verl's rollout servers once they are up).
        self.max_in_flight = max_in_flight
        self.api_key = api_key
        self.max_sticky = max_sticky
        self.replicas: list[Replica] = [Replica(u, api_key=api_key) for u in upstreams]
        self._sticky: OrderedDict[str, Replica] = OrderedDict()

    def set_upstreams(self, upstreams: list[str]) -> list[Replica]:
        """Replace the replica set, keeping what is known of replicas that stay; returns the dropped ones."""
        if not upstreams:
            raise ValueError("upstreams: at least one engine URL is needed")
        old = {r.url: r for r in self.replicas}
        new = []
        for url in upstreams:
            url = url.rstrip("/")
            new.append(old.pop(url, None) or Replica(url, api_key=self.api_key))
        self.replicas = new
        gone = set(map(id, old.values()))
        for key in [k for k, r in self._sticky.items() if id(r) in gone]:
            del self._sticky[key]
        return list(old.values())

    def _candidates(self, rollout_id: str | None, tried: list[Replica]) -> Replica | None:
        now = time.monotonic()
        sticky = self._sticky.get(rollout_id) if rollout_id else None
        if (
            sticky is not None
            and sticky not in tried
            and sticky.in_flight < self.max_in_flight
            and sticky.down_until <= now
            and sticky in self.replicas
        ):
            return sticky
        best: Replica | None = None
        for r in self.replicas:
            if r in tried or r.in_flight >= self.max_in_flight:
                continue
            if best is None or (r.down_until > now, r.in_flight) < (best.down_until > now, best.in_flight):
                best = r
        return best

    def pick(self, rollout_id: str | None, tried: list[Replica]) -> Replica:
        """The replica for the next attempt; raises :class:`Saturated` when all are full."""
        replica = self._candidates(rollout_id, tried)
        if replica is None:
            if tried:
                raise UpstreamUnavailable("no other replica to retry on")
            raise Saturated()
        if rollout_id and rollout_id not in self._sticky:
            self._sticky[rollout_id] = replica
            if len(self._sticky) > self.max_sticky:
                self._sticky.popitem(last=False)
        return replica

    async def send(self, rollout_id: str | None, path: str, body: bytes) -> tuple[Replica, UpstreamResponse]:
        """POST ``body`` to a replica, retrying connect errors and 502/503 on the others.

        The caller owns the returned replica's in-flight slot and must call
        :meth:`done` once it has read the answer.
        """
        tried: list[Replica] = []
        last_error = "no replica"
        last_status = 502
        for _ in range(len(self.replicas)):
            try:
                replica = self.pick(rollout_id, tried)
            except UpstreamUnavailable:
                break
            tried.append(replica)
            replica.in_flight += 1
            try:
                resp = await replica.pool.request("POST", path, body)
            except UpstreamConnectError as exc:
                replica.in_flight -= 1
                replica.down_until = time.monotonic() + _DOWN_FOR_S
                last_error, last_status = str(exc), 502
                log.warning("gateway: %s", exc)
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            if resp.status in RETRY_STATUSES:
                detail = (await resp.read())[:500].decode("utf-8", "replace")
                replica.in_flight -= 1
                replica.down_until = time.monotonic() + _DOWN_FOR_S
                last_error, last_status = f"{replica.url} answered {resp.status}: {detail}", resp.status
                log.warning("gateway: %s", last_error)
                continue
            replica.down_until = 0.0
            return replica, resp
        raise UpstreamUnavailable(f"engine unavailable: {last_error}", status=last_status)

    @staticmethod
    def done(replica: Replica) -> None:
        replica.in_flight -= 1

    async def close(self) -> None:
        for r in self.replicas:
            await r.pool.close()
