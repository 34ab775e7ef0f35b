"""The benchmarks' load generator: the gateway's own engine client, :mod:`agl_trainer.gateway.upstream`.

A small keep-alive HTTP/1.1 client on asyncio streams (Content-Length bodies, answers with a
Content-Length or chunked, keep-alive connections in a pool, headers per request), so it costs
a fraction of a general client's time per request and takes little of the machine from the
processes it measures. ``bench_gateway --httpx --aiohttp`` measures those two libraries against it
in the same run.
"""

from __future__ import annotations

from agl_trainer.gateway.upstream import ConnectionPool, Endpoint, UpstreamResponse

__all__ = ["ConnectionPool", "Endpoint", "UpstreamResponse"]
