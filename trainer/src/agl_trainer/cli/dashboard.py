"""``agl dashboard``: the web dashboard over a SQLite file or a PostgreSQL store, without a store server.

``agl store serve`` serves the same pages under ``/ui`` next to the store API.
"""

from __future__ import annotations

import sys

from agl import env
from agl.credentials import new_token
from agl.errors import ConfigError
from agl_trainer.cli._common import (
    STORE_HELP,
    Credential,
    add_header_timeout_argument,
    add_store_argument,
    header_timeout,
    retire_token_flags,
)

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})

ADMIN_TOKEN = Credential(
    "--admin-token", env.STORE_TOKEN, "the token the pages ask for (the store server's admin token does the same)"
)
"""The dashboard's login token: ``agl store serve`` asks for its admin token on the same pages."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="web pages of runs and rollouts over a sqlite:// or postgresql:// store"
    )
    add_store_argument(parser, help="the store to show; " + STORE_HELP)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=4318, help="port to bind (default 4318)")
    add_header_timeout_argument(parser)
    ADMIN_TOKEN.add_to(parser, "a new one, printed")
    retire_token_flags(parser, ADMIN_TOKEN)
    parser.set_defaults(func=run_dashboard)


def create_app(store, *, token: str):
    """The dashboard under ``/ui``, ``/`` sending there and ``/healthz`` answering without a token."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, RedirectResponse
    from starlette.routing import Route

    from agl_trainer.dashboard import PREFIX, with_dashboard

    async def home(request):
        return RedirectResponse(f"{PREFIX}/runs", status_code=303)

    async def healthz(request):
        return JSONResponse({"ok": True})

    root = Starlette(routes=[Route("/", home), Route("/healthz", healthz)])
    return with_dashboard(root, store, token=token)


def run_dashboard(args) -> int:
    import uvicorn

    from agl.store.base import default_store_url, open_store
    from agl_trainer.cli._ports import ensure_port_free
    from agl_trainer.http import http_protocol

    if args.port < 0 or args.port > 65535:
        raise ConfigError(f"--port: must be between 0 and 65535, got {args.port}")
    http = http_protocol("auto", header_timeout(args))
    ensure_port_free(args.host, args.port)
    url = args.store or default_store_url()
    if url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--store: {url!r} is a store server, which serves the dashboard itself at {url.rstrip('/')}/ui"
        )
    token = ADMIN_TOKEN.read(args)
    if not token:
        token = new_token(24)
        print(f"agl dashboard: no token given; log in with this one: {token}", flush=True)
    if args.host not in LOOPBACK:
        print(f"agl dashboard: binding {args.host}: reachable beyond this machine", file=sys.stderr, flush=True)
    store = open_store(url, create=False)
    try:
        app = create_app(store, token=token)
        print(f"agl dashboard: http://{args.host}:{args.port}/ui/ showing {store!r}", flush=True)
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            http=http,
            ws="none",
        )
    finally:
        store.close()
    return 0
