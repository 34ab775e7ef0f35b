"""``agl gateway serve``: run the model gateway in front of engine replicas.

The gateway binds 127.0.0.1 and always wants a bearer token: ``--token``, else
``$AGL_GATEWAY_TOKEN`` (the variable ``agl run`` and ``agl runner`` read too), else a
random one, printed with the ``export`` line that hands it to ``agl run``. The engines'
key is ``--upstream-api-key``, else ``$AGL_UPSTREAM_API_KEY``, else
``$AGL_ENGINE_API_KEY`` (the variable ``agl engine serve`` reads).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from agl.credentials import new_token
from agl_trainer.cli._common import add_store_argument
from agl_trainer.cli.run import TOKEN_ENV  # one variable for the gateway, agl run and agl runner


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="the model gateway that records token ids")
    sub = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible gateway")
    add_store_argument(s)
    s.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="URL",
        help="an engine replica's base URL, e.g. http://127.0.0.1:8000/v1 (repeat for several)",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8088)
    s.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"bearer token clients must send (default: ${TOKEN_ENV}, else a random one, printed)",
    )
    s.add_argument("--max-in-flight", type=int, default=512, help="requests in flight per replica before 429")
    s.add_argument(
        "--upstream-api-key",
        default=os.environ.get("AGL_UPSTREAM_API_KEY") or os.environ.get("AGL_ENGINE_API_KEY"),
        help="bearer token the engines expect (default: $AGL_UPSTREAM_API_KEY, else $AGL_ENGINE_API_KEY)",
    )
    s.add_argument("--model-version", default=None, help="model version recorded on calls until changed")
    s.set_defaults(func=serve)


def announce_token(args: argparse.Namespace, url: str, token: str) -> None:
    """Say where the token came from, and how ``agl run`` gets the URL and token (the token only if made up)."""
    if args.token:
        source = f"${TOKEN_ENV}" if args.token == os.environ.get(TOKEN_ENV) else "--token"
        print(f"agl gateway: token from {source}", flush=True)
        print(f"agl gateway: for agl run: export AGL_GATEWAY_URL={url} {TOKEN_ENV}=<the same token>", flush=True)
    else:
        print(f"agl gateway: token {token} (random: neither --token nor ${TOKEN_ENV} was given)", flush=True)
        print(f"agl gateway: for agl run: export AGL_GATEWAY_URL={url} {TOKEN_ENV}={token}", flush=True)


def serve(args: argparse.Namespace) -> int:
    """``agl gateway serve``: serve until SIGINT or SIGTERM, then print how many calls were recorded."""
    from agl.errors import ConfigError
    from agl.store import open_store
    from agl_trainer.gateway import Gateway

    if args.max_in_flight < 1:
        raise ConfigError("--max-in-flight: must be at least 1")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a TCP port")
    if args.token is not None and not args.token.strip():
        raise ConfigError("--token: must not be empty")
    token = args.token or new_token(24)
    store = open_store(args.store)
    try:
        gw = Gateway(
            store,
            args.upstream,
            token=token,
            host=args.host,
            port=args.port,
            max_in_flight=args.max_in_flight,
            upstream_api_key=args.upstream_api_key,
            model_version=args.model_version,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    gw.start()
    print(f"agl gateway: serving {gw.base_url} (rollouts: {gw.url}/rollouts/<rollout_id>/v1)", flush=True)
    print(f"agl gateway: upstreams {', '.join(args.upstream)}", flush=True)
    announce_token(args, gw.url, token)
    try:
        stop.wait()
    finally:
        status = gw.status()
        gw.stop()
        store.close()
        print(f"agl gateway: stopped after recording {status['recorded']} calls", flush=True)
    return 0
