"""``agl gateway serve``: run the model gateway in front of engine replicas.

The gateway binds 127.0.0.1 and holds three credentials (see
:mod:`agl_trainer.gateway.auth`), each from a flag, a file (``--*-file``, kept out of
the process list) or a variable, else random:

- the token for production traffic: ``--token``/``--token-file``/``$AGL_GATEWAY_TOKEN``;
- the admin token for ``/admin``: ``--admin-token``/``--admin-token-file``/``$AGL_GATEWAY_ADMIN_TOKEN``;
- the secret rollout keys are made with: ``--rollout-key-secret-file``/``$AGL_ROLLOUT_KEY_SECRET``;
  ``agl run``, ``agl runner`` and ``agl store serve`` need the same one.

What was made up is printed, with the ``export`` line that hands the URL and the key
secret to ``agl run``. With an ``http://`` store, the gateway needs the store's admin
token (``--store-token-file`` or ``$AGL_STORE_TOKEN``): it records calls of every rollout,
late ones included, which a runner token may not write. The engines' key is ``--upstream-api-key``, else
``$AGL_UPSTREAM_API_KEY``, else ``$AGL_ENGINE_API_KEY`` (the variable ``agl engine serve`` reads).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from agl.credentials import ROLLOUT_KEY_SECRET_ENV, RolloutKeys, new_token, read_token
from agl_trainer.cli._common import add_store_argument, add_store_token_arguments, store_options
from agl_trainer.cli.run import ADMIN_TOKEN_ENV, TOKEN_ENV  # one variable for the gateway, agl run and agl runner


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="the model gateway that records token ids")
    sub = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible gateway")
    add_store_argument(s)
    add_store_token_arguments(s)
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
        help=f"bearer token of production clients (default: ${TOKEN_ENV}, else a random one, printed)",
    )
    s.add_argument("--token-file", metavar="PATH", default=None, help="file holding --token (kept out of argv)")
    s.add_argument(
        "--admin-token",
        default=None,
        help=f"bearer token of the /admin routes (default: ${ADMIN_TOKEN_ENV}, else random)",
    )
    s.add_argument("--admin-token-file", metavar="PATH", default=None, help="file holding --admin-token")
    s.add_argument(
        "--rollout-key-secret-file",
        metavar="PATH",
        default=None,
        help=f"file holding the secret rollout keys are made with (default: ${ROLLOUT_KEY_SECRET_ENV}, else random)",
    )
    s.add_argument("--max-in-flight", type=int, default=512, help="requests in flight per replica before 429")
    s.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body in MiB (default 32)")
    s.add_argument(
        "--upstream-api-key",
        default=os.environ.get("AGL_UPSTREAM_API_KEY") or os.environ.get("AGL_ENGINE_API_KEY"),
        help="bearer token the engines expect (default: $AGL_UPSTREAM_API_KEY, else $AGL_ENGINE_API_KEY)",
    )
    s.add_argument("--model-version", default=None, help="model version recorded on calls until changed")
    s.set_defaults(func=serve)


def announce_token(args: argparse.Namespace, url: str, token: str, admin_token: str, secret: str | None) -> None:
    """Say where each credential came from (printing only the ones made up), and how ``agl run`` and
    ``agl runner`` get the URL and the key secret."""
    if args.token:
        source = f"${TOKEN_ENV}" if args.token == os.environ.get(TOKEN_ENV) else "--token"
        print(f"agl gateway: token from {source}", flush=True)
    elif args.token_file:
        print("agl gateway: token from --token-file", flush=True)
    else:
        print(f"agl gateway: token {token} (random: neither --token nor ${TOKEN_ENV} was given)", flush=True)
    if args.admin_token or args.admin_token_file or os.environ.get(ADMIN_TOKEN_ENV):
        print(
            "agl gateway: admin token from " + ("a file" if args.admin_token_file else "the flag or environment"),
            flush=True,
        )
    else:
        print(f"agl gateway: admin token {admin_token} (random; for /admin routes only)", flush=True)
    shown = f"{ROLLOUT_KEY_SECRET_ENV}={secret}" if secret else f"{ROLLOUT_KEY_SECRET_ENV}=<the same secret>"
    print(f"agl gateway: for agl run and agl runner: export AGL_GATEWAY_URL={url} {shown}", flush=True)


def serve(args: argparse.Namespace) -> int:
    """``agl gateway serve``: serve until SIGINT or SIGTERM, then print how many calls were recorded."""
    from agl.errors import ConfigError
    from agl.store import open_store
    from agl_trainer.gateway import Gateway

    if args.max_in_flight < 1:
        raise ConfigError("--max-in-flight: must be at least 1")
    if args.max_body_mb <= 0:
        raise ConfigError(f"--max-body-mb: must be positive, got {args.max_body_mb}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a TCP port")
    if args.token is not None and not args.token.strip():
        raise ConfigError("--token: must not be empty")
    file_token = read_token("--token", None, args.token_file) if args.token_file else None
    token = file_token or args.token or new_token(24)
    admin_token = read_token("--admin-token", args.admin_token, args.admin_token_file, ADMIN_TOKEN_ENV) or new_token(24)
    keys = RolloutKeys.from_env(args.rollout_key_secret_file)
    made_secret = keys is None
    keys = keys or RolloutKeys.generate()
    store = open_store(args.store, **store_options(args, args.store or ""))
    try:
        gw = Gateway(
            store,
            args.upstream,
            token=token,
            admin_token=admin_token,
            keys=keys,
            host=args.host,
            port=args.port,
            max_in_flight=args.max_in_flight,
            upstream_api_key=args.upstream_api_key,
            model_version=args.model_version,
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    gw.start()
    print(f"agl gateway: serving {gw.base_url} (rollouts: {gw.url}/rollouts/<rollout_id>/v1)", flush=True)
    print(f"agl gateway: upstreams {', '.join(args.upstream)}", flush=True)
    announce_token(args, gw.url, token, admin_token, keys.secret if made_secret else None)
    try:
        stop.wait()
    finally:
        status = gw.status()
        gw.stop()
        store.close()
        print(f"agl gateway: stopped after recording {status['recorded']} calls", flush=True)
    return 0
