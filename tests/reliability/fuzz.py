"""A seeded HTTP fuzzer for agl's servers (the store server and the gateway).

Each server is described by its routes: a method, a path (``{rollout}``-style
placeholders are filled in when sending) and a function making a valid JSON body.
From a ``random.Random(seed)`` the fuzzer makes requests that are mostly almost
right, so that they get past the first checks: a valid body with one value
replaced (NaN, Infinity, an integer past 64 bits, a 5,000-digit number, a lone
surrogate, a megabyte string, 100,000-deep nesting, the wrong type), unknown or
missing fields, malformed or truncated JSON, gzip/deflate bodies (good, corrupt,
or mislabelled), the wrong method, odd ids in the path, junk in the query string,
and missing or garbled credentials. A few requests lie about their length and
hang up halfway, and a few hang up after the first bytes of the answer (a stream
cut short by its client). A route may take its credential in ``x-api-key`` (as the
``anthropic`` SDK sends it) rather than ``Authorization``.

The same seed gives the same requests, credentials are named (``admin``,
``none``, ...) and looked up only when sending, so a failure report
(:meth:`FuzzRequest.describe`) is enough to replay one request. Routes are dealt like
cards, every route once a round in a shuffled order, so each gets its share of any run.

What a server serves is listed by the server itself (:class:`ServedRoute`, from its route
table); :func:`run` counts the requests each served route received, so a test can see that
none was missed, a route added later included.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import random
import re
import socket
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

Body = Callable[[random.Random], Any]

WEIRD_VALUES: list[Callable[[random.Random], Any]] = [
    lambda r: float("nan"),
    lambda r: float("inf"),
    lambda r: -float("inf"),
    lambda r: 2**64,
    lambda r: -(2**63) - 1,
    lambda r: 10**40,
    lambda r: r.randint(-(2**70), 2**70),
    lambda r: -1,
    lambda r: 0,
    lambda r: 1.5,
    lambda r: None,
    lambda r: True,
    lambda r: "",
    lambda r: "\u0000",
    lambda r: "\ud800",  # a lone surrogate: valid JSON text, not encodable as UTF-8
    lambda r: "é" * r.randint(1, 50),
    lambda r: "x" * r.choice([1_000, 100_000, 1_000_000]),
    lambda r: [],
    lambda r: {},
    lambda r: [1, "a", None],
    lambda r: {"nested": {"deeper": [float("nan")]}},
    lambda r: "2026-01-01T00:00:00Z",
]

# Credentials by name; ``good`` is the route's own credential, the rest are looked up by the sender.
BAD_AUTHS = ["none", "garbled", "wrong", "basic", "empty", "long", "latin1"]


@dataclass(frozen=True)
class Route:
    """One route of a server: ``body`` makes a valid JSON body (None: no body); ``auth`` names its credential."""

    method: str
    path: str
    body: Body | None = None
    auth: str = "admin"
    good_auth_ok: bool = True  # False: only ever sent with a credential that must be refused (admin actions)
    content_type: str = "application/json"
    auth_header: str = "Authorization"  # or "x-api-key": the credential alone, no scheme


@dataclass
class FuzzRequest:
    """One generated request; ``auth`` and path placeholders are resolved by :meth:`Target.send`."""

    index: int
    mutation: str
    method: str
    path: str
    auth: str
    route_auth: str = "admin"  # the credential of the route it was made from ("good" sends that one)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    declared_length: int | None = None  # set: the request claims this length, sends less and hangs up
    read_then_hang_up: int | None = None  # set: read this many bytes of the answer, then hang up
    auth_header: str = "Authorization"

    def describe(self) -> str:
        body = self.body
        if body is not None and len(body) > 400:
            body = body[:400] + f"... ({len(body)} bytes in all)".encode()
        lie = f" claiming Content-Length {self.declared_length}" if self.declared_length is not None else ""
        if self.read_then_hang_up is not None:
            lie += f" hanging up after {self.read_then_hang_up} bytes of the answer"
        if self.auth_header != "Authorization":
            lie += f" credential in {self.auth_header}"
        return (
            f"request #{self.index} [{self.mutation}]: {self.method} {self.path} auth={self.auth}"
            f" headers={self.headers}{lie} body={body!r}"
        )


@functools.cache
def _bomb() -> bytes:
    """64 MiB of spaces in about 64 KiB of gzip."""
    return gzip.compress(b" " * (64 << 20), compresslevel=9)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True, ensure_ascii=True).encode()


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every position in a JSON value (the root included), as key paths."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    holder = value
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = new
    return value


def _containers(value: Any) -> list[tuple]:
    return [p for p in _leaves(value) if isinstance(_get(value, p), dict)]


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


class Fuzzer:
    """Makes ``FuzzRequest``s for ``routes`` from ``seed``; ``max_big`` caps the size of big bodies."""

    def __init__(self, seed: int, routes: list[Route], *, max_big: int = 2_000_000):
        self.seed = seed
        self.routes = routes
        self.max_big = max_big
        self.rng = random.Random(seed)
        self._deck: list[Route] = []

    def requests(self, n: int) -> Iterator[FuzzRequest]:
        for i in range(n):
            yield self._one(i)

    def _next_route(self) -> Route:
        """The next route of a shuffled round of them all."""
        if not self._deck:
            self._deck = list(self.routes)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def _one(self, index: int) -> FuzzRequest:
        r = self.rng
        route = self._next_route()
        valid = route.body(r) if route.body is not None else None
        request = FuzzRequest(
            index, "valid", route.method, route.path, "good", route.auth, auth_header=route.auth_header
        )
        if route.body is not None:
            request.headers["Content-Type"] = route.content_type
            request.body = valid if isinstance(valid, bytes) else _dumps(valid)
        if not route.good_auth_ok:
            request.auth = r.choice([*BAD_AUTHS, "production", "key"])
            request.mutation = "admin route, no admin credential"
        roll = r.random()
        if roll < 0.40 and isinstance(valid, (dict, list)):
            self._mutate_json(request, copy.deepcopy(valid))
        elif roll < 0.55:
            self._mutate_text(request)
        elif roll < 0.63:
            self._mutate_encoding(request)
        elif roll < 0.70:
            request.mutation = "wrong method"
            request.method = r.choice(
                [m for m in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS") if m != route.method]
            )
        elif roll < 0.78:
            self._mutate_path(request)
        elif roll < 0.88 and route.good_auth_ok:
            request.mutation = "bad credential"
            request.auth = r.choice([*BAD_AUTHS, "production", "key", "runner", "lowercase"])
        elif roll < 0.91 and request.body:
            request.mutation = "truncated on the wire"
            request.declared_length = len(request.body) + r.randint(1, 1000)
            request.body = request.body[: r.randint(0, len(request.body))]
        elif roll < 0.94 and request.body:
            request.mutation = "answer cut short by the client"
            request.read_then_hang_up = r.choice([1, 64, 300])
        return request

    # -- mutations -------------------------------------------------------------------------
    def _mutate_json(self, request: FuzzRequest, value: Any) -> None:
        r = self.rng
        kind = r.choice(["value", "value", "value", "unknown field", "missing field", "top level", "deep", "digits"])
        if kind == "value":
            where = r.choice(list(_leaves(value)))
            new = r.choice(WEIRD_VALUES)(r)
            request.mutation = f"value at {list(where)} -> {type(new).__name__}"
            body = _dumps(_replace(value, where, new))
        elif kind == "unknown field" and _containers(value):
            where = r.choice(_containers(value))
            _get(value, where)["zz_unknown_" + str(r.randint(0, 99))] = r.choice(WEIRD_VALUES)(r)
            request.mutation = f"unknown field in {list(where)}"
            body = _dumps(value)
        elif kind == "missing field" and any(_get(value, p) for p in _containers(value)):
            where = r.choice([p for p in _containers(value) if _get(value, p)])
            holder = _get(value, where)
            gone = r.choice(list(holder))
            del holder[gone]
            request.mutation = f"missing field {[*where, gone]}"
            body = _dumps(value)
        elif kind == "deep":
            depth = r.choice([65, 1_000, 100_000])
            where = r.choice(list(_leaves(value)))
            marker = "__DEEP__"
            text = _dumps(_replace(value, where, marker)).decode()
            nest = "[" * depth + "1" + "]" * depth if r.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth
            request.mutation = f"{depth}-deep nesting at {list(where)}"
            body = text.replace(json.dumps(marker), nest, 1).encode()
        elif kind == "digits":
            where = r.choice(list(_leaves(value)))
            marker = "__DIGITS__"
            text = _dumps(_replace(value, where, marker)).decode()
            number = r.choice(["9" * 5000, "1e400", "-1e400", "1" + "0" * 30, "0.1e-400", "-0"])
            request.mutation = f"number {number[:12]}... at {list(where)}"
            body = text.replace(json.dumps(marker), number, 1).encode()
        else:
            new = r.choice([[value], "a string", 42, None, [], True])
            request.mutation = f"top level {type(new).__name__}"
            body = _dumps(new)
        if len(body) > self.max_big:
            body = body[: self.max_big]
            request.mutation += ", cut to max_big"
        request.body = body
        request.headers.setdefault("Content-Type", "application/json")

    def _mutate_text(self, request: FuzzRequest) -> None:
        r = self.rng
        body = request.body or b"{}"
        kind = r.choice(["truncated", "garbage", "not utf-8", "empty", "bom", "duplicate keys", "trailing", "text"])
        request.mutation = f"malformed: {kind}"
        if kind == "truncated":
            body = body[: r.randint(0, max(0, len(body) - 1))]
        elif kind == "garbage":
            body = r.randbytes(r.randint(1, 2000))
        elif kind == "not utf-8":
            body = body[:-1] + b'"\xff\xfe\xc3"' + body[-1:] if body.endswith(b"}") else b'"\xff\xfe"'
        elif kind == "empty":
            body = b""
        elif kind == "bom":
            body = b"\xef\xbb\xbf" + body
        elif kind == "duplicate keys":
            body = body[:-1] + b',"a":1,"a":2}' if body.endswith(b"}") and len(body) > 2 else b'{"a":1,"a":2}'
        elif kind == "trailing":
            body = body + b" }garbage"
        else:
            request.headers["Content-Type"] = r.choice(["text/plain", "application/x-www-form-urlencoded", ""])
        request.body = body
        request.headers.setdefault("Content-Type", "application/json")

    def _mutate_encoding(self, request: FuzzRequest) -> None:
        r = self.rng
        body = request.body or b"{}"
        kind = r.choice(["gzip", "deflate", "corrupt gzip", "not gzip", "unknown", "gzip bomb", "double gzip"])
        request.mutation = f"encoding: {kind}"
        if kind == "gzip":
            request.headers["Content-Encoding"], body = "gzip", gzip.compress(body)
        elif kind == "deflate":
            request.headers["Content-Encoding"], body = "deflate", zlib.compress(body)
        elif kind == "corrupt gzip":
            packed = bytearray(gzip.compress(body))
            for _ in range(3):
                packed[r.randrange(len(packed))] ^= 0xFF
            request.headers["Content-Encoding"], body = "gzip", bytes(packed)
        elif kind == "not gzip":
            request.headers["Content-Encoding"] = "gzip"
        elif kind == "unknown":
            request.headers["Content-Encoding"] = r.choice(["br", "zstd", "x-unknown", "gzip, gzip", "identity"])
        elif kind == "gzip bomb":
            request.headers["Content-Encoding"], body = "gzip", _bomb()
        else:
            request.headers["Content-Encoding"], body = "gzip, gzip", gzip.compress(gzip.compress(body))
        request.body = body
        request.headers.setdefault("Content-Type", "application/json")

    def _mutate_path(self, request: FuzzRequest) -> None:
        r = self.rng
        odd = r.choice(
            ["..", "a/../../b", "%00", "%2F%2F", "x" * 5000, "é", "%ff", "{x}", "a b", "?", "ro-1/finish/extra", ""]
        )
        kind = r.choice(["id", "query", "suffix"])
        request.mutation = f"path: {kind}"
        if kind == "id" and "{" in request.path:
            start = request.path.index("{")
            request.path = request.path[:start] + odd + request.path[request.path.index("}", start) + 1 :]
        elif kind == "query":
            junk = r.choice(
                ["limit=abc", "limit=-1", "limit=" + "9" * 40, "offset=1e400", "sort=%00", "a=%ff&&&=", "page=-5"]
            )
            request.path = request.path + ("&" if "?" in request.path else "?") + junk
        else:
            request.path = request.path.rstrip("/") + "/" + odd


@dataclass(frozen=True)
class ServedRoute:
    """A route as its server lists it: a method and a path template (``{name}`` one segment,
    ``{name:path}`` any)."""

    method: str
    path: str
    regex: re.Pattern

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def served_routes(pairs: Iterable[tuple[str, str]]) -> list[ServedRoute]:
    """``(method, path template)`` pairs, in the order the server tries them, as :class:`ServedRoute`."""
    from starlette.routing import compile_path

    return [ServedRoute(method, path, compile_path(path)[0]) for method, path in pairs]


def starlette_routes(routes: Iterable[Any]) -> list[ServedRoute]:
    """What a list of starlette routes serves: each of its methods (HEAD, which GET brings, left out)."""
    pairs = []
    for route in routes:
        for method in sorted(route.methods - {"HEAD"}):
            pairs.append((method, route.path))
    return served_routes(pairs)


def route_of(served: list[ServedRoute], method: str, path: str) -> ServedRoute | None:
    """The served route a request reaches: the first whose method and path match, as the server picks."""
    path = path.partition("?")[0]
    for route in served:
        if route.method == method and route.regex.match(path):
            return route
    return None


@dataclass
class Outcome:
    """What one server answered: counts by status, and the requests answered 5xx or not at all;
    ``by_route``: the requests each served route received (when the target lists them)."""

    seed: int
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    by_route: dict[str, int] = field(default_factory=dict)

    def missed(self, served: list[ServedRoute], at_least: int = 1) -> list[str]:
        """The served routes that received fewer than ``at_least`` requests."""
        return [str(route) for route in served if self.by_route.get(str(route), 0) < at_least]

    def report(self) -> str:
        head = f"seed {self.seed}: {len(self.failures)} of {self.sent} requests failed (statuses {self.statuses})"
        return "\n".join([head, *self.failures[:10]])


class Target:
    """A running server to fuzz: its base URL, credentials by name and path placeholders."""

    def __init__(
        self,
        url: str,
        credentials: dict[str, str],
        placeholders: dict[str, str],
        timeout_s: float = 30,
        served: list[ServedRoute] | None = None,
    ):
        self.url = url.rstrip("/")
        self.host, _, port = self.url.removeprefix("http://").partition(":")
        self.port = int(port)
        self.credentials = credentials
        self.placeholders = placeholders
        self.served = served or []  # what the server says it serves
        self.client = httpx.Client(base_url=self.url, timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def _authorization(self, name: str, route_auth: str) -> bytes | None:
        good = self.credentials.get(route_auth, "")
        if name == "good" and not good:
            return None  # an open route (health)
        good = good or "no-credential"
        return {
            "none": None,
            "empty": b"",
            "garbled": b"Bearer",
            "wrong": b"Bearer not-the-token",
            "basic": b"Basic Zm9vOmJhcg==",
            "long": b"Bearer " + b"k" * 10_000,
            "latin1": b"Bearer \xe9\xff" + good.encode(),
            "lowercase": b"bearer " + good.encode(),
            "good": b"Bearer " + good.encode(),
        }.get(name, b"Bearer " + self.credentials.get(name, "unknown-credential").encode())

    def path_of(self, request: FuzzRequest) -> str:
        path = request.path
        for name, value in self.placeholders.items():
            path = path.replace("{" + name + "}", value)
        return path

    def send(self, request: FuzzRequest) -> int | None:
        """Send ``request``; its status, or None when it was a lie about its length and got no answer."""
        headers = dict(request.headers)
        auth = self._authorization(request.auth, request.route_auth)
        path = self.path_of(request)
        if request.declared_length is not None:
            return self._send_truncated(request, path, headers, auth)
        raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        if auth is not None:
            raw_headers.append(_credential_header(request.auth_header, auth))
        if request.read_then_hang_up is not None:
            return self._hang_up_mid_answer(request, path, raw_headers)
        response = self.client.request(request.method, path, headers=raw_headers, content=request.body)
        return response.status_code

    def _hang_up_mid_answer(self, request: FuzzRequest, path: str, headers: list) -> int:
        """Send ``request``, read the first bytes of its answer and close the connection."""
        with (
            httpx.Client(base_url=self.url, timeout=self.client.timeout) as once,
            once.stream(request.method, path, headers=headers, content=request.body) as response,
        ):
            for _ in response.iter_raw(request.read_then_hang_up):
                break
            return response.status_code

    def _send_truncated(
        self, request: FuzzRequest, path: str, headers: dict[str, str], auth: bytes | None
    ) -> int | None:
        lines = [f"{request.method} {path} HTTP/1.1".encode(), f"Host: {self.host}:{self.port}".encode()]
        lines += [f"{k}: {v}".encode() for k, v in headers.items()]
        if auth is not None:
            name, value = _credential_header(request.auth_header, auth)
            lines.append(name + b": " + value)
        lines.append(f"Content-Length: {request.declared_length}".encode())
        with socket.create_connection((self.host, self.port), timeout=10) as s:
            s.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (request.body or b""))
            s.shutdown(socket.SHUT_WR)
            answer = b""
            try:
                while chunk := s.recv(65536):
                    answer += chunk
            except (TimeoutError, ConnectionResetError):
                pass
        if not answer.startswith(b"HTTP/1.1 "):
            return None  # the server hung up: right for a request that never arrived whole
        return int(answer[9:12])


def _credential_header(name: str, authorization: bytes) -> tuple[bytes, bytes]:
    """The header carrying a credential: ``Authorization`` as made, or ``x-api-key`` with the scheme left out."""
    if name.lower() == "authorization":
        return b"Authorization", authorization
    scheme, _, rest = authorization.partition(b" ")
    return name.encode(), rest if scheme.lower() == b"bearer" else authorization


def run(fuzzer: Fuzzer, target: Target, n: int) -> Outcome:
    """Send ``n`` requests from ``fuzzer`` to ``target``; 5xx answers and transport errors are failures."""
    outcome = Outcome(fuzzer.seed)
    for request in fuzzer.requests(n):
        reached = route_of(target.served, request.method, target.path_of(request))
        if reached is not None:
            outcome.by_route[str(reached)] = outcome.by_route.get(str(reached), 0) + 1
        try:
            status = target.send(request)
        except httpx.HTTPError as exc:
            outcome.failures.append(f"no answer ({type(exc).__name__}: {exc}) to {request.describe()}")
            outcome.sent += 1
            continue
        outcome.sent += 1
        if status is not None:
            outcome.statuses[status] = outcome.statuses.get(status, 0) + 1
            if status >= 500:
                outcome.failures.append(f"{status} to {request.describe()}")
    return outcome
