"""``agl runner my_module:agent``: a runner process that claims rollouts from a store and runs the agent.

Each agent gets its rollout's own key as ``ctx.api_key`` (never the gateway's token): the
key the store server handed out with the claim (a server started with the key secret), else
one made here with the secret in ``--rollout-key-secret-file`` or ``$AGL_ROLLOUT_KEY_SECRET``.
An agent runs in this process, so it could read what the runner holds: give the runner a
store server's *runner* token (``--store-token-file`` or ``$AGL_STORE_TOKEN``), which cannot
enqueue, read other data or expire, and run untrusted agents as ``agl run`` children.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from agl_trainer.cli._common import add_store_client_arguments, store_options
from agl_trainer.cli.run import GATEWAY_TOKEN, NO_KEY, add_gateway_arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("runner", help="run an agent on rollouts claimed from a store")
    p.add_argument("agent", help="the agent function, as module:function or path/to/file.py:function")
    add_store_client_arguments(p)
    add_gateway_arguments(p)
    GATEWAY_TOKEN.add_to(p, "none; the agent's api key only when no rollout key can be had")
    p.add_argument("--model", default="agl-policy", help="model name the agent is told to ask for")
    p.add_argument("--concurrency", type=int, default=4, help="rollouts run at once (default 4)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per rollout when the rollout names none")
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats (default 5)")
    p.add_argument(
        "--store-outage",
        type=float,
        default=300.0,
        help="seconds to keep retrying a store that does not answer before exiting (default 300); "
        "rollouts that end meanwhile are finished once it is back",
    )
    p.add_argument("--resources", default=None, help="JSON object (or @file.json) given to the agent as ctx.resources")
    p.add_argument("--max-rollouts", type=int, default=None, help="stop after starting this many rollouts")
    p.add_argument("--until-idle", action="store_true", help="stop when the queue is empty and nothing runs")
    p.add_argument(
        "--set-env",
        action="store_true",
        help="set OPENAI_BASE_URL/OPENAI_API_BASE/OPENAI_API_KEY and ANTHROPIC_BASE_URL/ANTHROPIC_API_KEY per rollout "
        "(needs --concurrency 1)",
    )
    p.set_defaults(func=run)


def load_json_arg(name: str, value: str | None) -> dict:
    """A JSON object given inline or as ``@path``; a clear error naming the flag otherwise."""
    from agl.errors import ConfigError

    if value is None:
        return {}
    try:
        text = Path(value[1:]).read_text() if value.startswith("@") else value
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}: not a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a JSON object, got {type(data).__name__}")
    return data


def rollout_keys(args):
    """The :class:`~agl.credentials.RolloutKeys` the runner makes keys with (None: the store hands them out).

    A gateway with neither a key secret nor a store server to hand out keys is a ConfigError.
    """
    from agl.credentials import RolloutKeys
    from agl.errors import ConfigError

    keys = RolloutKeys.from_env(args.rollout_key_secret_file)
    store = args.store or ""
    if args.gateway and keys is None and not store.startswith(("http://", "https://")):
        raise ConfigError(NO_KEY.replace("for the child", "for the agents"))
    return keys


def run(args) -> int:
    from agl.errors import ConfigError
    from agl.runner import Runner, load_agent
    from agl.store import open_store

    if args.concurrency < 1:
        raise ConfigError(f"--concurrency: must be at least 1, got {args.concurrency}")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError(f"--timeout: must be positive, got {args.timeout}")
    if args.store_outage <= 0:
        raise ConfigError(f"--store-outage: must be positive, got {args.store_outage}")
    keys = rollout_keys(args)
    agent = load_agent(args.agent)
    resources = load_json_arg("--resources", args.resources)
    store = open_store(args.store, **store_options(args, args.store or ""))
    runner = Runner(
        agent,
        store,
        gateway_url=args.gateway,
        api_key=GATEWAY_TOKEN.read(args) or "agl",
        rollout_keys=keys,
        model=args.model,
        concurrency=args.concurrency,
        default_timeout_s=args.timeout,
        heartbeat_s=args.heartbeat,
        store_outage_s=args.store_outage,
        resources=resources,
        set_env=args.set_env,
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: runner.stop())
    print(f"agl runner {runner.runner_id}: running {args.agent} on {store!r}, {args.concurrency} at a time", flush=True)
    try:
        counts = runner.run_sync(max_rollouts=args.max_rollouts, until_idle=args.until_idle)
    finally:
        runner.close()
        store.close()
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no rollouts"
    print(f"agl runner {runner.runner_id}: done: {summary}", flush=True)
    return 0
