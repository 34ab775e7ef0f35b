"""``agl gateway serve``: run the model gateway in front of engine replicas."""

from __future__ import annotations

import os
import secrets
import signal
import threading


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="the model gateway that records token ids")
    sub = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible gateway")
    s.add_argument("--store", default=None, help="store URL (default: $AGL_STORE_URL or .agl/agl.db)")
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
        default=os.environ.get("AGL_GATEWAY_TOKEN"),
        help="bearer token clients must send (default: $AGL_GATEWAY_TOKEN, else a random one, printed)",
    )
    s.add_argument("--max-in-flight", type=int, default=512, help="requests in flight per replica before 429")
    s.add_argument(
        "--upstream-api-key",
        default=os.environ.get("AGL_UPSTREAM_API_KEY"),
        help="bearer token the engines expect, if any",
    )
    s.add_argument("--model-version", default=None, help="model version recorded on calls until changed")
    s.set_defaults(func=serve)


def serve(args) -> int:
    from agl.errors import ConfigError
    from agl.store import open_store
    from agl_trainer.gateway import Gateway

    if args.max_in_flight < 1:
        raise ConfigError("--max-in-flight: must be at least 1")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a TCP port")
    token = args.token or secrets.token_urlsafe(24)
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
    if not args.token:
        print(f"agl gateway: token {token}", flush=True)
    try:
        stop.wait()
    finally:
        status = gw.status()
        gw.stop()
        store.close()
        print(f"agl gateway: stopped after recording {status['recorded']} calls", flush=True)
    return 0
