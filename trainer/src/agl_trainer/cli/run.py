"""``agl run -- python their_agent.py``: an unmodified script as one rollout.

Which rollout:

- ``--rollout-id ID``: that rollout; it must be running (claimed by whoever started
  ``agl run``, for example a runner whose agent launches the script);
- otherwise the next queued rollout is claimed; when the queue is empty a task
  (input from ``--input``, default ``{"argv": [...]}``) and a rollout for it are
  created and claimed.

The child gets ``AGL_ROLLOUT_ID``, ``AGL_STORE_URL``, ``AGL_TASK_INPUT`` (the
task's input as JSON), ``AGL_RESOURCES_DIR`` when the rollout has resources (a folder holding
each as a file, ``<name>.txt`` for a text such as a prompt an optimizer chose, ``<name>.json``
for the others, removed when the child ends, so a program whose prompt lives in a file is
pointed at it: ``--prompt-file "$AGL_RESOURCES_DIR/system_prompt.txt"``) and
``AGL_ROLLOUT_KEY`` (the rollout's own key, see :mod:`agl.credentials`) on top of the caller's
environment and, with a gateway (``--gateway`` or ``$AGL_GATEWAY_URL``), ``OPENAI_BASE_URL`` and ``OPENAI_API_BASE``
(this rollout's gateway route) and ``OPENAI_API_KEY``: the rollout's key again; for
Anthropic clients ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_URL`` (LangChain's
``ChatAnthropic`` reads that one first) are the same route without ``/v1`` (the
``anthropic`` SDK appends ``/v1/messages``), and ``ANTHROPIC_API_KEY`` the rollout's
key; a caller's ``ANTHROPIC_AUTH_TOKEN`` is left out then (a client sending it as well
would be refused by the gateway). The child never gets a token that opens more than its
rollout: ``AGL_STORE_TOKEN``, the gateway's tokens and the key secret are taken out of its environment (a child that
writes to a store server authenticates with its rollout key, which the server accepts
for that rollout's own observations).

The key comes from the store server that answered the claim (one started with the
key secret), else is made here with the secret in ``--rollout-key-secret-file`` or
``$AGL_ROLLOUT_KEY_SECRET`` (the one ``agl gateway serve`` uses), else, with
``--rollout-id``, is ``$AGL_ROLLOUT_KEY`` (from whoever claimed the rollout). A
gateway and no key is an error rather than a 401 in the child; with no gateway the
child's ``OPENAI_*`` and ``ANTHROPIC_*`` variables are left as they are. What the child gets is printed on
stderr (the key shortened, a store password hidden). Exit code 0 marks the rollout ``succeeded``; any other
code (or a signal) marks it ``failed`` with the code and the tail of the child's
stderr; running past ``--timeout`` kills it and marks it ``timed_out``.

With a gateway, when capture was switched on for the child (an ``AGL_<FRAMEWORK>_INSTRUMENT``
switch, ``opentelemetry-instrument`` as the command, or an ``AGL_*`` variable that looks like a
misspelled switch) and no LLM span joined any of the rollout's gateway calls, one line on stderr
says so, naming what was on and the likely causes (:mod:`agl_trainer.capture_check`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from agl import env
from agl_trainer.capture_check import switched_on_by
from agl_trainer.cli._common import (
    Credential,
    add_store_client_arguments,
    retire_flag,
    store_options,
)

if TYPE_CHECKING:
    from agl.schema import Rollout

GATEWAY_TOKEN = Credential(
    "--gateway-token", env.GATEWAY_TOKEN, "the gateway's bearer token for production traffic (no rollout)"
)
"""The gateway's production token: ``agl gateway serve`` checks it, ``agl runner`` sends it."""

#: Variables an agent's process must not inherit: each opens more than its own rollout (retired
#: names too, which may still hold a credential).
SECRET_VARIABLES = (
    env.STORE_TOKEN,
    env.STORE_RUNNER_TOKEN,
    env.GATEWAY_TOKEN,
    env.GATEWAY_ADMIN_TOKEN,
    env.ROLLOUT_KEY_SECRET,
    env.ENGINE_API_KEY,
    *env.RETIRED,
)


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gateway URL`` (default ``$AGL_GATEWAY_URL``) and ``--rollout-key-secret-file PATH``, as
    ``agl run`` and ``agl runner`` take them."""
    parser.add_argument(
        "--gateway",
        default=env.GATEWAY_URL.get(),
        help=f"the gateway's root URL, e.g. http://127.0.0.1:8088 (default: ${env.GATEWAY_URL})",
    )
    parser.add_argument(
        "--rollout-key-secret-file",
        metavar="PATH",
        default=None,
        help="file holding the secret rollout keys are made with, as the gateway has it "
        f"(default: ${env.ROLLOUT_KEY_SECRET}; not needed with a store server that makes keys)",
    )


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run an unmodified command as one rollout (agl run -- python agent.py)")
    add_store_client_arguments(p)
    add_gateway_arguments(p)
    for flag in (GATEWAY_TOKEN.flag, f"{GATEWAY_TOKEN.flag}-file"):
        retire_flag(p, flag, "leave it out: agl run needs no gateway token (the child gets its rollout's key)")
    p.add_argument("--rollout-id", default=None, help="run as this rollout instead of claiming the next one")
    p.add_argument("--input", default=None, help="task input (JSON) when a new task has to be created")
    p.add_argument("--timeout", type=float, default=None, help="kill the command after this many seconds")
    p.add_argument(
        "--max-response-tokens",
        type=_positive_int,
        default=None,
        help="the gateway ends each of the rollout's responses after this many tokens (for a new rollout)",
    )
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats (default 5)")
    p.add_argument("command", nargs="+", help="the command, after --")
    p.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of tokens, got {text!r}")
    return value


def _resolve_rollout(store, args, runner_id: str):
    from agl.errors import AglError
    from agl.schema import Rollout, RolloutStatus, Task

    if args.rollout_id:
        rollout = store.get_rollout(args.rollout_id)
        if rollout.status == RolloutStatus.RUNNING:
            rollout.task = store.get_task(rollout.task_id)
            return rollout, rollout.runner_id or runner_id
        raise AglError(
            f"--rollout-id: rollout {rollout.rollout_id} is {rollout.status.value}, not running; "
            "claim it first, or leave out --rollout-id to claim the next queued rollout"
        )
    claimed = store.claim(runner_id, limit=1)
    if claimed:
        return claimed[0], runner_id
    try:
        task_input = json.loads(args.input) if args.input is not None else {"argv": args.command}
    except ValueError as exc:
        raise AglError(f"--input: not JSON: {exc}") from None
    task = Task(input=task_input, split="run")
    store.add_tasks([task])
    store.enqueue(
        [
            Rollout(
                task_id=task.task_id,
                mode="production",
                timeout_s=args.timeout,
                max_response_tokens=args.max_response_tokens,
            )
        ]
    )
    claimed = store.claim(runner_id, limit=1)
    if not claimed:
        raise AglError("the rollout just enqueued was claimed by another runner; run again")
    return claimed[0], runner_id


NO_KEY = (
    f"--gateway: no rollout key for the child: set ${env.ROLLOUT_KEY_SECRET} or --rollout-key-secret-file "
    "to the secret the gateway uses (agl gateway serve prints it when it made one up), or use a store "
    "server started with that secret"
)


def check_key_source(args: argparse.Namespace) -> None:
    """Refuse, before claiming anything, a gateway with no way to get the rollout's key."""
    from agl.errors import ConfigError

    store = args.store or ""
    if store.startswith(("http://", "https://")) or args.rollout_key_secret_file:
        return
    if env.ROLLOUT_KEY_SECRET.get() or (args.rollout_id and env.ROLLOUT_KEY.get()):
        return
    raise ConfigError(NO_KEY)


def rollout_key(store, args: argparse.Namespace, rollout: Rollout) -> str | None:
    """The rollout's key for the child (see the module docstring for where it comes from)."""
    from agl.credentials import RolloutKeys

    from_store = getattr(store, "rollout_key", None)
    key = from_store(rollout.rollout_id, rollout.attempt) if from_store is not None else None
    if key:
        return key
    keys = RolloutKeys.from_env(args.rollout_key_secret_file)
    if keys is not None:
        return keys.mint(rollout.rollout_id, rollout.attempt)
    if args.rollout_id:
        return env.ROLLOUT_KEY.get() or None
    return None


ANTHROPIC_URLS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_URL")
"""What Anthropic clients read their base URL from (the ``anthropic`` SDK, LangChain's ``ChatAnthropic``)."""
SHADOWING = {"ANTHROPIC_API_KEY": "ANTHROPIC_AUTH_TOKEN"}
"""A credential ``agl run`` hands the child → the caller's variable left out with it (clients send both)."""


def absolute_store_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute, so that a child that changes directory
    (or a program started from its own) still writes to the store ``agl run`` uses."""
    from agl.store.base import sqlite_path, sqlite_url

    if "://" not in url or url.lower().startswith("sqlite:"):
        return sqlite_url(sqlite_path(url))
    return url


def child_env(args: argparse.Namespace, rollout: Rollout, store_url: str, key: str | None) -> dict[str, str]:
    """The variables ``agl run`` sets for the child (on top of the caller's environment, less
    :data:`SECRET_VARIABLES`)."""
    handed = {
        env.ROLLOUT_ID: rollout.rollout_id,
        env.STORE_URL: absolute_store_url(store_url),
        env.TASK_INPUT: json.dumps(rollout.task.input if rollout.task else None),
    }
    if key:
        handed[env.ROLLOUT_KEY] = key
    if args.gateway:
        from agl.runner import rollout_base_url

        base = rollout_base_url(args.gateway, rollout.rollout_id)
        route = base.removesuffix("/v1")
        handed |= {"OPENAI_BASE_URL": base, "OPENAI_API_BASE": base, "OPENAI_API_KEY": key}
        handed |= {name: route for name in ANTHROPIC_URLS} | {"ANTHROPIC_API_KEY": key}
    return handed


_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def written_resources(rollout: Rollout, handed: dict[str, str]) -> tempfile.TemporaryDirectory | None:
    """The rollout's resources as files in a new folder, named in ``handed`` as ``AGL_RESOURCES_DIR``
    (None when it has none). A name that cannot be a file name is said on stderr and left out."""
    if not rollout.resources:
        return None
    folder = tempfile.TemporaryDirectory(prefix=f"agl-resources-{_safe_prefix(rollout.rollout_id)}-")
    for name, value in rollout.resources.items():
        if not _FILE_NAME.fullmatch(name):
            print(f"agl run: resource {name!r} is not a file name; not written", file=sys.stderr, flush=True)
            continue
        path, text = (f"{name}.txt", value) if isinstance(value, str) else (f"{name}.json", json.dumps(value))
        with open(os.path.join(folder.name, path), "w", encoding="utf-8") as f:
            f.write(text)
    handed[env.RESOURCES_DIR] = folder.name
    return folder


def _safe_prefix(rollout_id: str) -> str:
    """Up to 40 characters of ``rollout_id`` usable in a file name: any other than ``A-Za-z0-9_.-`` becomes ``_``
    (an id may hold ``/``, which would name a folder that does not exist)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", rollout_id[:40])


def full_child_env(handed: dict[str, str]) -> dict[str, str]:
    """The child's whole environment: the caller's, less every token that opens more than one rollout
    and less a credential of the caller's that a handed one replaces (:data:`SHADOWING`)."""
    left_out = set(SECRET_VARIABLES) | {SHADOWING[k] for k in handed if k in SHADOWING}
    return {k: v for k, v in os.environ.items() if k not in left_out} | handed


def shorten_secret(secret: str) -> str:
    """Enough of a token to tell two apart in a log, never all of it."""
    return f"{secret[:4]}... ({len(secret)} chars)" if len(secret) >= 16 else f"*** ({len(secret)} chars)"


def hide_password(url: str) -> str:
    """``url`` with the password of its user part, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def describe_env(handed: dict[str, str], args: argparse.Namespace) -> str:
    """The lines ``agl run`` prints about what it hands the child."""
    lines = [
        f"agl run: the child gets {env.ROLLOUT_ID}={handed[env.ROLLOUT_ID]}, "
        f"{env.STORE_URL}={hide_password(handed[env.STORE_URL])}, {env.TASK_INPUT} (the task input as JSON)"
    ]
    if env.RESOURCES_DIR in handed:
        lines.append(
            f"agl run: the child gets {env.RESOURCES_DIR}={handed[env.RESOURCES_DIR]} (its resources as files)"
        )
    if "OPENAI_BASE_URL" in handed:
        lines.append(
            f"agl run: the child gets OPENAI_BASE_URL=OPENAI_API_BASE={handed['OPENAI_BASE_URL']}, "
            f"OPENAI_API_KEY={env.ROLLOUT_KEY}=this rollout's key: {shorten_secret(handed['OPENAI_API_KEY'])} "
            "(no store or gateway token)"
        )
        lines.append(
            f"agl run: the child gets ANTHROPIC_BASE_URL=ANTHROPIC_API_URL={handed['ANTHROPIC_BASE_URL']}, "
            "ANTHROPIC_API_KEY=this rollout's key (ANTHROPIC_AUTH_TOKEN left out)"
        )
    else:
        lines.append(
            f"agl run: no gateway (--gateway or ${env.GATEWAY_URL}): OPENAI_* and ANTHROPIC_* left as they are, "
            "so the child's LLM calls are not recorded with token ids"
        )
    return "\n".join(lines)


def run(args) -> int:
    from agl.errors import ConfigError
    from agl.schema import RolloutStatus, short_id
    from agl.store.base import default_store_url, open_store

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("command: give the command to run after --, e.g. agl run -- python agent.py")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError(f"--timeout: must be positive, got {args.timeout}")
    if args.gateway:
        check_key_source(args)
    store_url = args.store or default_store_url()
    store = open_store(store_url, **store_options(args, store_url))
    resources = None
    try:
        rollout, runner_id = _resolve_rollout(store, args, f"agl-run-{os.getpid()}-{short_id(6)}")
        key = rollout_key(store, args, rollout)
        if args.gateway and not key:
            store.finish(
                rollout.rollout_id, RolloutStatus.FAILED, error="agl run: no rollout key", attempt=rollout.attempt
            )
            raise ConfigError(NO_KEY)
        handed = child_env(args, rollout, store_url, key)
        resources = written_resources(rollout, handed)
        child_environ = full_child_env(handed)
        timeout = args.timeout or rollout.timeout_s
        print(
            f"agl run: rollout {rollout.rollout_id} (attempt {rollout.attempt}): {' '.join(command)}",
            file=sys.stderr,
            flush=True,
        )
        print(describe_env(handed, args), file=sys.stderr, flush=True)
        code, timed_out, tail = _run_child(
            command, child_environ, timeout, lambda: store.heartbeat([rollout.rollout_id], runner_id), args.heartbeat
        )
        if timed_out:
            status, error = RolloutStatus.TIMED_OUT, f"TimeoutError: the command ran past {timeout}s and was killed"
        elif code == 0:
            status, error = RolloutStatus.SUCCEEDED, None
        else:
            why = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            status, error = RolloutStatus.FAILED, f"CommandFailed: {why}" + (f"\n{tail}" if tail else "")
        ended = store.finish(rollout.rollout_id, status, error=error, attempt=rollout.attempt)
        print(
            f"agl run: rollout {rollout.rollout_id} {status.value}"
            + (" (queued again)" if ended.status == RolloutStatus.QUEUED else ""),
            file=sys.stderr,
            flush=True,
        )
        if args.gateway:
            warn_silent_capture(store, ended, switched_on_by(child_environ, command))
        return code if code >= 0 else 128 - code
    finally:
        store.close()
        if resources is not None:
            resources.cleanup()


def warn_silent_capture(store, ended: Rollout, capture: list[str]) -> None:
    """Say on stderr, in one line, when capture was on and no LLM span joined the rollout's gateway calls."""
    from agl_trainer.capture_check import silent_capture_warning
    from agl_trainer.transitions import TransitionBuilder, TransitionConfig

    if not capture or not ended.status.terminal:
        return
    _await_gateway_calls(store, ended.rollout_id)
    builder = TransitionBuilder(store, TransitionConfig(missing_reward=0.0, reward_plugins=False))
    try:
        builder.build([ended])
    except Exception as exc:  # the rollout is recorded already; only the check is lost, and said so
        print(f"agl run: could not check what capture recorded: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    if builder.report.rollouts_without_spans:
        print(f"agl run: warning: {silent_capture_warning(capture, 1, ended.rollout_id)}", file=sys.stderr)


GATEWAY_RECORDS_WAIT_S = 5.0
"""How long the capture check waits for the gateway's records of a rollout to reach the store: the
gateway answers a call first and writes its record a moment later (sooner than its writer's
interval on an idle host, later on a loaded one), so a check made as the child exits could find
no call yet and say nothing. Only a rollout that made no call through the gateway waits it whole."""


def _await_gateway_calls(store, rollout_id: str, wait_s: float = GATEWAY_RECORDS_WAIT_S) -> None:
    """Return once the store holds a gateway call of the rollout, or ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    while not any(True for _ in store.query_llm_calls(rollout_id=rollout_id)) and time.monotonic() < deadline:
        time.sleep(0.05)


def _run_child(command, environ, timeout, beat, heartbeat_s) -> tuple[int, bool, str]:
    """Run the command, forwarding its stderr while keeping the last lines; heartbeat meanwhile."""
    from agl.errors import AglError

    try:
        child = subprocess.Popen(command, env=environ, stderr=subprocess.PIPE)
    except OSError as exc:
        raise AglError(f"command: cannot start {command[0]!r}: {exc}") from None
    tail: deque[str] = deque(maxlen=20)

    def pump() -> None:
        for raw in child.stderr:
            sys.stderr.buffer.write(raw)
            sys.stderr.buffer.flush()
            tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    previous = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            wait = heartbeat_s if deadline is None else max(0.0, min(heartbeat_s, deadline - time.monotonic()))
            try:
                child.wait(wait)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                    child.kill()
                    child.wait()
                    break
                try:
                    beat()
                except Exception as exc:  # a missed beat is not fatal; the next one tries again
                    print(f"agl run: heartbeat failed: {exc}", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reader.join(timeout=5)
    return child.returncode, timed_out, "\n".join(tail)
