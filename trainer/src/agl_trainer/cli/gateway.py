"""``agl gateway serve``: run the model gateway in front of engine replicas.

The gateway binds 127.0.0.1 and holds these credentials (see :mod:`agl_trainer.gateway.auth`
and :mod:`agl_trainer.cli._common`), each from its flag, its ``-file`` form (kept out of
the process list) or its variable, never from another's:

- the token for production traffic: ``--gateway-token``, ``$AGL_GATEWAY_TOKEN``, else random;
- the admin token for ``/admin``: ``--admin-token``, ``$AGL_GATEWAY_ADMIN_TOKEN``, else random;
- the secret rollout keys are made with: ``--rollout-key-secret-file``, ``$AGL_ROLLOUT_KEY_SECRET``,
  else random; ``agl run``, ``agl runner`` and ``agl store serve`` need the same one;
- the token it sends the engines: ``--engine-token``, ``$AGL_ENGINE_API_KEY`` (the one
  ``agl engine serve`` reads), else none;
- the token it sends an ``http://`` store: ``--store-token``, ``$AGL_STORE_TOKEN``. It must be
  the store's admin token: the gateway records calls of every rollout, late ones included,
  which a runner token may not write.

What was made up is printed, with the ``export`` line that hands the URL and the key
secret to ``agl run``.
"""

from __future__ import annotations

import argparse
import gc
import signal
import threading

from agl import env
from agl.credentials import RolloutKeys, new_token
from agl_trainer.cli._common import (
    ENGINE_TOKEN,
    Credential,
    add_header_timeout_argument,
    add_store_client_arguments,
    header_timeout,
    retire_flag,
    retire_token_flags,
    store_options,
)
from agl_trainer.cli.run import GATEWAY_TOKEN

ADMIN_TOKEN = Credential("--admin-token", env.GATEWAY_ADMIN_TOKEN, "bearer token of the /admin routes")
"""The gateway's admin token."""


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="the model gateway that records token ids")
    sub = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible gateway")
    add_store_client_arguments(s)
    s.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="URL",
        help="an engine replica's base URL, e.g. http://127.0.0.1:8000/v1 (repeat for several)",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8088)
    GATEWAY_TOKEN.add_to(s, "a random one, printed")
    ADMIN_TOKEN.add_to(s, "random")
    ENGINE_TOKEN.add_to(s, "none")
    retire_token_flags(s, GATEWAY_TOKEN)
    retire_flag(s, "--upstream-api-key", f"use {ENGINE_TOKEN.flag} ({ENGINE_TOKEN.what})")
    s.add_argument(
        "--rollout-key-secret-file",
        metavar="PATH",
        default=None,
        help=f"file holding the secret rollout keys are made with (default: ${env.ROLLOUT_KEY_SECRET}, else random)",
    )
    s.add_argument("--max-in-flight", type=int, default=512, help="requests in flight per replica before 429")
    s.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body in MiB (default 32)")
    s.add_argument(
        "--engine-logprobs",
        choices=("raw", "behaviour"),
        default="raw",
        help="what the engines' logprobs are: raw (agl engine serve, vLLM's raw_logprobs mode) or behaviour "
        "(vLLM's processed_logprobs mode: the log-probs tokens were sampled with); default raw",
    )
    add_header_timeout_argument(s)
    s.add_argument("--model-version", default=None, help="model version recorded on calls until changed")
    s.set_defaults(func=serve)


def announce_token(args: argparse.Namespace, url: str, token: str, admin_token: str, secret: str | None) -> None:
    """Say where each credential came from (printing only the ones made up), and how ``agl run`` and
    ``agl runner`` get the URL and the key secret."""
    source = GATEWAY_TOKEN.source(args)
    if source:
        print(f"agl gateway: token from {source}", flush=True)
    else:
        neither = f"neither {GATEWAY_TOKEN.flag} nor ${GATEWAY_TOKEN.variable} was given"
        print(f"agl gateway: token {token} (random: {neither})", flush=True)
    source = ADMIN_TOKEN.source(args)
    if source:
        print(f"agl gateway: admin token from {source}", flush=True)
    else:
        print(f"agl gateway: admin token {admin_token} (random; for /admin routes only)", flush=True)
    shown = f"{env.ROLLOUT_KEY_SECRET}={secret}" if secret else f"{env.ROLLOUT_KEY_SECRET}=<the same secret>"
    print(f"agl gateway: for agl run and agl runner: export {env.GATEWAY_URL}={url} {shown}", flush=True)


def serve(args: argparse.Namespace) -> int:
    """``agl gateway serve``: serve until SIGINT or SIGTERM, then print how many calls were recorded."""
    from agl.errors import ConfigError
    from agl.store import open_store
    from agl_trainer.cli._ports import ensure_port_free
    from agl_trainer.gateway import Gateway

    if args.max_in_flight < 1:
        raise ConfigError("--max-in-flight: must be at least 1")
    if args.max_body_mb <= 0:
        raise ConfigError(f"--max-body-mb: must be positive, got {args.max_body_mb}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a TCP port")
    header_timeout_s = header_timeout(args)
    if retired := env.retired_in_use():
        raise ConfigError("; ".join(retired))
    ensure_port_free(args.host, args.port)
    token = GATEWAY_TOKEN.read(args) or new_token(24)
    admin_token = ADMIN_TOKEN.read(args) or new_token(24)
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
            upstream_api_key=ENGINE_TOKEN.read(args),
            model_version=args.model_version,
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
            engine_logprobs=args.engine_logprobs,
            header_timeout_s=header_timeout_s,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    gw.start()
    # What the process holds once started (modules, the app, its tables) lives as long as it does:
    # moved out of the collector's generations, a collection walks only what calls make.
    gc.freeze()
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
