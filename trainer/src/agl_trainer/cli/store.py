"""``agl store``, ``agl rollouts`` and ``agl spans``: serve a store and look inside one.

The store comes from ``--store URL``, else ``$AGL_STORE_URL``, else ``.agl/agl.db`` (the store
``agl train`` writes by default). The commands that only look refuse a store that does not exist.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Any

from agl import env
from agl.credentials import RolloutKeys, new_token
from agl.errors import ConfigError
from agl_trainer.cli._common import (
    STORE_CLIENT,
    STORE_HELP,
    Credential,
    add_header_timeout_argument,
    add_store_argument,
    add_store_client_arguments,
    header_timeout,
    open_for_command,
    retire_token_flags,
)
from agl_trainer.cli._ports import ensure_port_free

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})

ADMIN_TOKEN = Credential("--admin-token", env.STORE_TOKEN, "the admin's bearer token: every route")
"""``agl store serve``'s admin token."""

RUNNER_TOKEN = Credential(
    "--runner-token",
    env.STORE_RUNNER_TOKEN,
    "the runners' bearer token: claim, heartbeat, finish, write running rollouts' observations",
)
"""``agl store serve``'s runner token."""


def _store_arg(parser: argparse.ArgumentParser) -> None:
    add_store_client_arguments(parser)
    retire_token_flags(parser, STORE_CLIENT)


def register(subparsers) -> None:
    store = subparsers.add_parser("store", help="serve a store over HTTP, or show what one holds")
    store_cmds = store.add_subparsers(dest="store_command", metavar="COMMAND", required=True)

    serve = store_cmds.add_parser("serve", help="serve a store over HTTP (127.0.0.1 unless --host says otherwise)")
    add_store_argument(serve, help="the store to serve, created if missing; " + STORE_HELP)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=4317, help="port to bind (default 4317)")
    ADMIN_TOKEN.add_to(serve, "a new one, printed")
    retire_token_flags(serve, ADMIN_TOKEN)
    RUNNER_TOKEN.add_to(serve, "no runner scope")
    serve.add_argument(
        "--rollout-key-secret-file",
        metavar="PATH",
        help="file holding the secret rollout keys are made with, the gateway's (default: "
        f"${env.ROLLOUT_KEY_SECRET}; none: claims hand out no keys and rollout keys are refused)",
    )
    serve.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body in MiB (default 32)")
    add_header_timeout_argument(serve)
    serve.add_argument(
        "--expire-every",
        type=float,
        default=10.0,
        help="seconds between passes that take back rollouts of silent runners (default 10; 0: never)",
    )
    serve.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=60.0,
        help="a runner not heard from for this many seconds loses its rollouts (default 60)",
    )
    serve.set_defaults(func=run_serve)

    stats = store_cmds.add_parser("stats", help="counts of what the store holds")
    _store_arg(stats)
    stats.set_defaults(func=run_stats)

    rollouts = subparsers.add_parser("rollouts", help="list rollouts or show one")
    rollout_cmds = rollouts.add_subparsers(dest="rollouts_command", metavar="COMMAND", required=True)
    listing = rollout_cmds.add_parser("list", help="rollouts, oldest first")
    _store_arg(listing)
    listing.add_argument("--status", action="append", help="only this status (repeatable)")
    listing.add_argument("--task", help="only rollouts of this task id")
    listing.add_argument("--limit", type=int, default=50, help="show at most N rollouts (default 50; 0: all)")
    listing.set_defaults(func=run_rollouts_list)
    show = rollout_cmds.add_parser("show", help="a rollout, its attempts, and its spans as a tree with rewards")
    _store_arg(show)
    show.add_argument("rollout_id")
    show.set_defaults(func=run_rollouts_show)
    reward = rollout_cmds.add_parser("reward", help="attach a reward to a rollout afterwards (a human's judgement)")
    _store_arg(reward)
    reward.add_argument("rollout_id")
    reward.add_argument("value", help="the reward, a number")
    reward.add_argument("--name", default="reward", help="the reward's name (default: reward, the one training uses)")
    reward.add_argument("--source", default="human", help="who gave it (default: human)")
    reward.set_defaults(func=run_rollouts_reward)

    spans = subparsers.add_parser("spans", help="list spans")
    span_cmds = spans.add_subparsers(dest="spans_command", metavar="COMMAND", required=True)
    span_list = span_cmds.add_parser("list", help="the spans of a rollout, in order")
    _store_arg(span_list)
    span_list.add_argument("--rollout", required=True, help="rollout id")
    span_list.add_argument(
        "--kind", choices=["llm", "tool", "agent", "reward", "custom"], help="only spans of this kind"
    )
    span_list.set_defaults(func=run_spans_list)


# -- helpers ----------------------------------------------------------------------
def _open(args):
    """The store to read (:func:`open_for_command`)."""
    from agl.store.base import default_store_url

    return open_for_command(args, args.store or default_store_url())


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200, soft_wrap=False)  # pipes and tests: don't fold ids
    return console


def _when(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _duration(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return ""
    seconds = end - start
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _ago(ts: float | None, now: float | None = None) -> str:
    """How long ago ``ts`` was, coarsely (``12s ago``, ``4m ago``, ``3h ago``, ``2d ago``)."""
    if ts is None:
        return ""
    seconds = max(0.0, (time.time() if now is None else now) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _heard(ts: float | None) -> str:
    """A heartbeat time with how long ago it was."""
    return "" if ts is None else f"{_when(ts)} ({_ago(ts)})"


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# -- store ------------------------------------------------------------------------
def run_serve(args) -> int:
    from agl.store.base import default_store_url, open_store
    from agl_trainer.store_server import serve

    if args.port < 0 or args.port > 65535:
        raise ConfigError(f"--port: must be between 0 and 65535, got {args.port}")
    if args.max_body_mb <= 0:
        raise ConfigError(f"--max-body-mb: must be positive, got {args.max_body_mb}")
    if args.expire_every < 0:
        raise ConfigError(f"--expire-every: must be 0 (never) or more, got {args.expire_every}")
    if args.heartbeat_timeout <= 0:
        raise ConfigError(f"--heartbeat-timeout: must be positive, got {args.heartbeat_timeout}")
    header_timeout_s = header_timeout(args)
    ensure_port_free(args.host, args.port)
    token = ADMIN_TOKEN.read(args)
    runner_token = RUNNER_TOKEN.read(args)
    keys = RolloutKeys.from_env(args.rollout_key_secret_file)
    if runner_token and runner_token == token:
        raise ConfigError(
            "--runner-token: must differ from the admin token (--admin-token), or runners could do anything"
        )
    if not token:
        token = new_token(24)
        print(f"agl store: no admin token given; clients must send this one ({env.STORE_TOKEN}={token})", flush=True)
    url = args.store or default_store_url()
    if url.startswith(("http://", "https://")):
        raise ConfigError(f"--store: {url!r} is a store server already; serve a sqlite:// or postgresql:// store")
    if args.host not in LOOPBACK:
        print(f"agl store: binding {args.host}: reachable beyond this machine", file=sys.stderr, flush=True)
    store = open_store(url)
    try:
        print(f"agl store: serving {store!r} on http://{args.host}:{args.port}", flush=True)
        print(f"agl store: dashboard at http://{args.host}:{args.port}/ui/ (log in with the token)", flush=True)
        if runner_token:
            print("agl store: runners may use the runner token (claim, heartbeat, finish, observations)", flush=True)
        if keys is not None:
            print("agl store: claims hand out rollout keys (the key secret is set)", flush=True)
        if args.expire_every:
            print(
                f"agl store: rollouts of runners silent for {args.heartbeat_timeout:g}s are taken back "
                f"(checked every {args.expire_every:g}s)",
                flush=True,
            )
        serve(
            store,
            token=token,
            runner_token=runner_token,
            keys=keys,
            host=args.host,
            port=args.port,
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
            expire_every_s=args.expire_every,
            heartbeat_timeout_s=args.heartbeat_timeout,
            header_timeout_s=header_timeout_s,
        )
    finally:
        store.close()
    return 0


def run_stats(args) -> int:
    from rich.table import Table

    with _open(args) as store:
        stats = store.stats()
    table = Table("what", "count", title="store")
    table.add_row("tasks", str(stats.tasks))
    for status, n in sorted(stats.rollouts.items()):
        table.add_row(f"rollouts {status}", str(n))
    table.add_row("rollouts (all)", str(sum(stats.rollouts.values())))
    table.add_row("spans", str(stats.spans))
    table.add_row("llm calls", str(stats.llm_calls))
    table.add_row("rewards", str(stats.rewards))
    table.add_row("model versions", str(stats.model_versions))
    _console().print(table)
    return 0


# -- rollouts ---------------------------------------------------------------------
def run_rollouts_list(args) -> int:
    from rich.table import Table

    from agl.schema import RolloutStatus

    if args.limit < 0:
        raise ConfigError(f"--limit: must be 0 or more, got {args.limit}")
    statuses = None
    if args.status:
        try:
            statuses = [RolloutStatus(s) for s in args.status]
        except ValueError as exc:
            known = ", ".join(s.value for s in RolloutStatus)
            raise ConfigError(f"--status: {exc} (one of {known})") from None
    table = Table(
        "rollout", "task", "status", "attempt", "runner (last heard)", "step", "model", "created", "duration", "error"
    )
    shown = 0
    with _open(args) as store:
        for r in store.query_rollouts(task_id=args.task, status=statuses):
            if args.limit and shown >= args.limit:
                break
            table.add_row(
                r.rollout_id,
                r.task_id,
                r.status.value,
                f"{r.attempt}/{r.max_attempts}",
                _runner_cell(r),
                "" if r.step is None else str(r.step),
                r.model_version or "",
                _when(r.created_at),
                _duration(r.started_at, r.ended_at),
                _short(r.error or "", 40),
            )
            shown += 1
    console = _console()
    console.print(table)
    console.print(f"{shown} rollout(s)")
    return 0


def run_rollouts_reward(args) -> int:
    from agl_trainer.dashboard.app import reward_from_form

    try:
        reward = reward_from_form(args.rollout_id, {"value": args.value, "name": args.name, "source": args.source})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    with _open(args) as store:
        store.get_rollout(args.rollout_id)
        store.add_rewards([reward])
    print(f"{reward.reward_id}: {reward.name} = {reward.value:g} ({reward.source}) on {args.rollout_id}")
    return 0


def _runner_cell(rollout) -> str:
    """Who runs (or ran the last attempt of) a rollout; while it runs, when that runner was last heard."""
    from agl.schema import RolloutStatus

    if rollout.attempt == 0 or not rollout.runner_id:
        return ""
    if rollout.status == RolloutStatus.RUNNING:
        return f"{rollout.runner_id} ({_ago(rollout.heartbeat_at)})"
    return rollout.runner_id


def _span_label(span, rewards_by_span: dict[str, list]) -> str:
    from rich.markup import escape

    attrs = span.attributes
    details = [span.kind, _duration(span.start_time, span.end_time)]
    for key in ("gen_ai.agent.name", "gen_ai.request.model", "gen_ai.response.id", "gen_ai.tool.name"):
        if key in attrs:
            details.append(f"{key.rsplit('.', 2)[-2]}.{key.rsplit('.', 1)[-1]}={_short(attrs[key], 40)}")
    if span.status == "error":
        details.append("[red]error[/red]")
    label = f"[bold]{escape(span.name)}[/bold] {escape(span.span_id)} ({escape(', '.join(d for d in details if d))})"
    for reward in rewards_by_span.get(span.span_id, []):
        label += f"  [green]reward {escape(reward.name)}={reward.value:g}[/green]"
    return label


def run_rollouts_show(args) -> int:
    from rich.markup import escape
    from rich.table import Table
    from rich.tree import Tree

    with _open(args) as store:
        rollout = store.get_rollout(args.rollout_id)
        attempts = store.attempts(args.rollout_id)
        spans = list(store.query_spans(rollout_id=args.rollout_id))
        rewards = list(store.query_rewards(rollout_id=args.rollout_id))
    console = _console()

    summary = Table("field", "value", title=f"rollout {rollout.rollout_id}")
    for name in ("task_id", "status", "attempt", "max_attempts", "mode", "step", "model_version", "runner_id"):
        value = getattr(rollout, name)
        summary.add_row(name, escape(str(getattr(value, "value", value))))
    summary.add_row("created", _when(rollout.created_at))
    summary.add_row("started", _when(rollout.started_at))
    summary.add_row("last heartbeat", _heard(rollout.heartbeat_at) if rollout.attempt else "")
    summary.add_row("ended", _when(rollout.ended_at))
    if rollout.error:
        summary.add_row("error", escape(rollout.error))
    if rollout.output is not None:
        summary.add_row("output", escape(_short(rollout.output, 120)))
    console.print(summary)

    history = Table(
        "attempt", "runner", "status", "started", "ended", "last heartbeat", "duration", "error", title="attempts"
    )
    for a in attempts:
        history.add_row(
            str(a.attempt),
            escape(a.runner_id or ""),
            a.status.value,
            _when(a.started_at),
            _when(a.ended_at),
            _heard(a.heartbeat_at) if a.ended_at is None else _when(a.heartbeat_at),
            _duration(a.started_at, a.ended_at),
            escape(_short(a.error or "", 60)),
        )
    console.print(history)
    if not attempts:
        console.print("no attempt yet")

    rewards_by_span: dict[str, list] = defaultdict(list)
    for reward in rewards:
        if reward.span_id:
            rewards_by_span[reward.span_id].append(reward)
    children: dict[str | None, list] = defaultdict(list)
    known = {s.span_id for s in spans}
    for span in spans:
        children[span.parent_id if span.parent_id in known else None].append(span)

    tree = Tree(f"[bold]spans[/bold] ({len(spans)})")

    def grow(node, parent_id: str | None) -> None:
        for span in children.get(parent_id, []):
            grow(node.add(_span_label(span, rewards_by_span)), span.span_id)

    grow(tree, None)
    console.print(tree)

    totals = Table("reward", "value", "span", "source", title="rewards")
    for reward in rewards:
        totals.add_row(escape(reward.name), f"{reward.value:g}", reward.span_id or "(rollout)", escape(reward.source))
    console.print(totals)
    return 0


def run_spans_list(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    table = Table("seq", "span", "parent", "name", "kind", "status", "duration", "attributes")
    shown = 0
    with _open(args) as store:
        for s in store.query_spans(rollout_id=args.rollout, kind=args.kind):
            keys = ", ".join(sorted(s.attributes))
            table.add_row(
                str(s.seq),
                s.span_id,
                s.parent_id or "",
                escape(s.name),
                s.kind,
                s.status,
                _duration(s.start_time, s.end_time),
                escape(_short(keys, 60)),
            )
            shown += 1
    if not shown:
        with _open(args) as store:
            store.get_rollout(args.rollout)  # an unknown rollout is an error, not an empty list
    console = _console()
    console.print(table)
    console.print(f"{shown} span(s)")
    return 0
