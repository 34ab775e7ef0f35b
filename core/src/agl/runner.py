"""The runner: claims rollouts from the store and runs the user's agent on them.

The agent is a plain function, sync or ``async``::

    def agent(task_input, ctx: agl.RolloutContext): ...   # or agent(task_input)

``ctx`` carries this rollout's gateway base URL (``ctx.base_url``), the model name,
the api key and resources such as prompt templates. What the agent returns is read
like this:

- a number (``int``, ``float`` or ``bool``) is the rollout's final reward;
- an :class:`RolloutResult` gives both: ``RolloutResult(output=..., reward=...)``;
- None means the rewards come from ``agl.emit_reward`` or a reward plugin;
- anything else is the rollout's *output* (stored on the rollout, JSON), for a
  reward plugin to score.

A returned reward is stored as a :class:`~agl.schema.Reward` with source
``return``, which outranks plugin and emitted rewards (see :mod:`agl_trainer.transitions`).

Many rollouts run at once per process: async agents as asyncio tasks, sync agents
in a thread pool with the context variables copied. Each runs inside
``agl.use_rollout(ctx)`` with the runner's :class:`~agl.BufferedWriter`, which is
flushed when the rollout ends, *before* the rollout is marked finished, so a
trainer that sees a finished rollout sees all its observations.

An agent that raises ends its attempt ``failed``; one that runs past the rollout's
timeout ends it ``timed_out``; the error (type, message, short traceback) is stored
on the rollout and the store's retry policy (``max_attempts``) queues it again if
attempts are left. The loop goes on either way. A sync agent past its timeout
cannot be interrupted: its thread is abandoned (it keeps its pool slot until it
returns; the pool has room for ``concurrency`` more). A rollout cancelled in the
store (or taken back by :meth:`Store.expire`) while running is cancelled here at
the next heartbeat and not finished twice. Stopping the runner (:meth:`Runner.stop`,
SIGINT/SIGTERM to ``agl runner``) cancels what is in flight and ends those attempts
``failed`` with a ``RunnerStopped`` error, so the retry policy hands them to
another runner.

The runner rides out a store that goes away (a restart, a network cut): claims,
heartbeats and finishes that fail with a :class:`~agl.errors.Transient` error (or a
connection error or timeout; see :mod:`agl.retry`) are retried with
:data:`STORE_RETRY`'s exponential backoff and jitter for up to ``store_outage_s`` of
continuous failure, with one log line when the store goes away and one when it is
back. A rollout that ends meanwhile keeps its result (status, output, reward, error)
and is finished once the store answers again; it holds its concurrency slot until
then. The runner stops only when asked, when the store stays away longer than
``store_outage_s`` (:class:`~agl.errors.StoreUnavailable`), or on an error that
retrying cannot fix, raised from :meth:`Runner.run` after the rollouts in flight are
wound down: any other error from a claim or a heartbeat, and a refused token (401/403)
or request (another 4xx: :class:`~agl.errors.Refused`) from a finish. (A finish the
store refuses as bad input or for an unknown id is logged and counted, ``finish_refused``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from agl.capture import BufferedWriter, RolloutContext, use_rollout
from agl.env import ROLLOUT_ID
from agl.errors import AglError, InvalidTransition, Refused, StoreUnavailable
from agl.imports import import_attribute, import_module
from agl.retry import RetryPolicy, is_transient
from agl.schema import JSON, RETURN_SOURCE, Reward, Rollout, RolloutStatus, short_id
from agl.store.base import Store

log = logging.getLogger(__name__)

Agent = Callable[..., Any]

STORE_OUTAGE_S = 300.0
"""How long, by default, the runner keeps retrying a store that does not answer."""
STORE_RETRY = RetryPolicy(max_attempts=None, first_delay_s=0.4, max_delay_s=5.0)
"""The waits between the runner's tries at a store that fails transiently; how long it keeps
trying is ``store_outage_s`` (:class:`StoreOutage`), not the policy."""
_FLUSH_WAIT_S = 10.0  # one wait for the writer before a finish; a longer outage goes round the retry loop


class StoreOutage:
    """One runner's view of whether the store answers: a log line when it stops and
    one when it is back, and how long it has been away."""

    def __init__(self, runner_id: str, limit_s: float):
        self.runner_id = runner_id
        self.limit_s = limit_s
        self.since: float | None = None
        self.last_error: BaseException | None = None

    def failed(self, exc: BaseException, what: str) -> None:
        """A call to the store failed with a retryable error."""
        self.last_error = exc
        if self.since is None:
            self.since = time.monotonic()
            log.warning(
                "runner %s: the store is unreachable (%s failed: %s); retrying for up to %gs",
                self.runner_id,
                what,
                _one_line(exc),
                self.limit_s,
            )

    def answered(self) -> None:
        """A call to the store went through."""
        if self.since is not None:
            log.warning("runner %s: the store is back after %.1fs", self.runner_id, time.monotonic() - self.since)
            self.since = None

    def over(self) -> bool:
        """Whether the store has been away for longer than the limit."""
        return self.since is not None and time.monotonic() - self.since > self.limit_s

    def error(self) -> StoreUnavailable:
        """The error the runner stops with when the store stayed away too long."""
        return StoreUnavailable(
            f"runner {self.runner_id}: the store stayed unreachable for over {self.limit_s:g}s "
            f"(--store-outage); last error: {_one_line(self.last_error)}"
        )


def _one_line(exc: BaseException | None) -> str:
    if exc is None:
        return "none"
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


class RolloutResult(BaseModel):
    """What an agent may return to give both an output and a reward."""

    model_config = ConfigDict(extra="forbid")

    output: JSON = None
    """The rollout's output, stored as it is (JSON)."""
    reward: float | None = None
    """The rollout's final reward (source ``return``); None: none from the agent."""


def read_result(value: Any) -> tuple[Any, float | None]:
    """Split what an agent returned into ``(output, reward)`` (see the module docstring)."""
    if value is None:
        return None, None
    if isinstance(value, RolloutResult):
        return value.output, value.reward
    if isinstance(value, (bool, int, float)):
        return None, float(value)
    return value, None


def format_error(exc: BaseException, *, limit: int = 6, max_chars: int = 4000) -> str:
    """``Type: message`` and the last frames of the traceback, short enough to store."""
    head = f"{type(exc).__name__}: {exc}"
    frames = traceback.format_tb(exc.__traceback__, limit=-limit) if exc.__traceback__ else []
    text = head + ("\n" + "".join(frames).rstrip() if frames else "")
    return text if len(text) <= max_chars else text[: max_chars - 15] + "\n… (truncated)"


def _jsonable(value: Any) -> Any:
    """The output as JSON; a value JSON cannot hold is stored as its repr (and said so)."""
    import json

    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        log.warning("agent output of type %s is not JSON; storing its repr", type(value).__name__)
        return repr(value)


def _takes_context(agent: Agent) -> bool:
    try:
        params = list(inspect.signature(agent).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _is_async(agent: Agent) -> bool:
    return inspect.iscoroutinefunction(agent) or callable(agent) and inspect.iscoroutinefunction(type(agent).__call__)


def load_agent(spec: str) -> Agent:
    """Import ``module:function`` (or ``path/to/file.py:function``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AglError(f"agent: expected 'module:function', got {spec!r}")
    fn = import_attribute(import_module(module_name, "agent"), attr, "agent")
    if not callable(fn):
        raise AglError(f"agent: {spec!r} is not callable")
    return fn


def rollout_base_url(gateway_url: str, rollout_id: str) -> str:
    """The OpenAI base URL of one rollout on the gateway at ``gateway_url``: ``…/rollouts/{id}/v1``,
    the id percent-quoted as one path segment (an id may hold ``/``, ``?``, ``#`` or ``%``)."""
    return f"{gateway_url.rstrip('/')}/rollouts/{quote(rollout_id, safe='')}/v1"


class Runner:
    """Runs an agent on rollouts claimed from a store, ``concurrency`` at a time.

    ``gateway_url`` is the gateway's root (``http://127.0.0.1:PORT``); each rollout
    reaches it at ``{gateway_url}/rollouts/{rollout_id}/v1``. The agent's api key
    (``ctx.api_key``) is its rollout's own key (:mod:`agl.credentials`): made with
    ``rollout_keys`` (a :class:`~agl.credentials.RolloutKeys`) when given, else the one
    the store handed out with the claim (a store server holding the key secret), else
    ``api_key``. ``resources`` land in ``ctx.resources``, updated by
    ``mode_resources[rollout.mode]`` (e.g. ``{"val": {"temperature": 0}}``), then by the
    rollout's own :attr:`~agl.schema.Rollout.resources` (prompts an algorithm chose), and
    ``resources["mode"]`` says whether the rollout is for training or evaluation.
    ``default_timeout_s`` applies to rollouts enqueued without a timeout.
    With ``set_env=True`` (allowed only with ``concurrency=1``, since the
    environment is process-wide) ``OPENAI_BASE_URL``, ``OPENAI_API_BASE`` and
    ``OPENAI_API_KEY`` are set for each rollout, for agents that read them, and for
    Anthropic clients ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_URL`` (the rollout's
    route without ``/v1``) and ``ANTHROPIC_API_KEY`` (its key), as ``agl run`` sets them.
    """

    def __init__(
        self,
        agent: Agent,
        store: Store,
        *,
        gateway_url: str | None = None,
        model: str = "agl-policy",
        api_key: str = "agl",
        rollout_keys: Any = None,
        resources: dict[str, Any] | None = None,
        concurrency: int = 4,
        runner_id: str | None = None,
        default_timeout_s: float | None = None,
        heartbeat_s: float = 5.0,
        poll_s: float = 0.05,
        writer: BufferedWriter | None = None,
        set_env: bool = False,
        mode_resources: dict[str, dict[str, Any]] | None = None,
        store_outage_s: float = STORE_OUTAGE_S,
        stop_grace_s: float = 10.0,
    ):
        if concurrency < 1:
            raise AglError(f"concurrency: must be at least 1, got {concurrency}")
        if set_env and concurrency != 1:
            raise AglError("set_env: the environment is process-wide; it needs concurrency=1")
        if heartbeat_s <= 0:
            raise AglError(f"heartbeat_s: must be positive, got {heartbeat_s}")
        if store_outage_s <= 0:
            raise AglError(f"store_outage_s: must be positive, got {store_outage_s}")
        if stop_grace_s < 0:
            raise AglError(f"stop_grace_s: must be 0 or more, got {stop_grace_s}")
        self.agent = agent
        """The agent: ``agent(task_input)`` or ``agent(task_input, ctx)``, sync or async."""
        self.store = store
        """The store rollouts are claimed from and finished in."""
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        """The gateway's root URL, without a trailing slash; None: no gateway (``ctx.base_url`` is None)."""
        self.model = model
        """The model name agents are given (``ctx.model``)."""
        self.api_key = api_key
        """The key agents get when neither ``rollout_keys`` nor the claim gives the rollout one."""
        self.rollout_keys = rollout_keys
        """Makes each rollout's key (a :class:`~agl.credentials.RolloutKeys`), or None."""
        self.resources = dict(resources or {})
        """Resources every rollout gets in ``ctx.resources``."""
        self.mode_resources = {k: dict(v) for k, v in (mode_resources or {}).items()}
        """Resources by rollout mode, over ``resources`` (e.g. ``{"val": {"temperature": 0}}``)."""
        self.concurrency = concurrency
        """Rollouts run at once."""
        self.runner_id = runner_id or f"{socket.gethostname()}-{os.getpid()}-{short_id(8)}"
        """The id claims and heartbeats are made under (host, pid and a random part unless given)."""
        self.default_timeout_s = default_timeout_s
        """The timeout of rollouts enqueued without one; None: none."""
        self.heartbeat_s = heartbeat_s
        """Seconds between heartbeats for the running rollouts."""
        self.poll_s = poll_s
        """Seconds between claims while the queue is empty."""
        self.set_env = set_env
        """Whether each rollout's gateway URL and key are set in the environment (``OPENAI_*``, ``ANTHROPIC_*``)."""
        self.store_outage_s = store_outage_s
        """Seconds the store may stay away before :meth:`run` raises :class:`~agl.errors.StoreUnavailable`."""
        self.stop_grace_s = stop_grace_s
        """Seconds the runner waits, once stopping, for its cancelled rollouts' finishes and last writes."""
        self._own_writer = writer is None
        # The writer keeps observations through an outage at least as long as the runner waits.
        self.writer = writer or BufferedWriter(store, retry_for_s=max(600.0, 2 * store_outage_s))
        """The writer the agents' spans and rewards go through."""
        self._async = _is_async(agent)
        self._with_ctx = _takes_context(agent)
        self._active: dict[str, asyncio.Task] = {}
        self._delivering: dict[str, asyncio.Task] = {}  # ended rollouts whose finish is on its way
        self._taken_back: set[str] = set()
        self._outage = StoreOutage(self.runner_id, store_outage_s)
        self._fatal: BaseException | None = None
        self._stop_deadline: float | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = ThreadPoolExecutor(max_workers=concurrency * 2, thread_name_prefix="agl-agent")
        self.counts: dict[str, int] = {}
        """Attempts ended so far by status, and rollouts taken back, refused (finish) or undelivered."""

    # -- the loop --------------------------------------------------------------------------
    async def run(self, *, max_rollouts: int | None = None, until_idle: bool = False) -> dict[str, int]:
        """Claim and run rollouts until :meth:`stop`, ``max_rollouts`` started, or (``until_idle``) an empty queue.

        Returns how many attempts ended in each status. Raises what stopped it otherwise:
        :class:`~agl.errors.StoreUnavailable` when the store stayed away longer than
        ``store_outage_s``, or the store's error that retrying cannot fix (see the module docstring).
        """
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._stop_deadline = None
        self._fatal = None
        started = 0
        claim_id: str | None = None  # kept across retries, so a claim whose answer was lost is not taken twice
        failures = 0
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        try:
            while not self._stop.is_set():
                busy = len(self._active.keys() | self._delivering.keys())
                free = self.concurrency - busy
                if max_rollouts is not None:
                    free = min(free, max_rollouts - started)
                claimed: list[Rollout] = []
                if free > 0:
                    claim_id = claim_id or f"claim-{self.runner_id}-{short_id(12)}"
                    try:
                        claimed = await asyncio.to_thread(
                            self.store.claim, self.runner_id, limit=free, claim_id=claim_id
                        )
                    except Exception as exc:
                        if not is_transient(exc):
                            raise
                        self._outage.failed(exc, "claim")
                        if self._outage.over():
                            raise self._outage.error() from exc
                        failures += 1
                        await self._wait(STORE_RETRY.delay_s(failures))
                        continue
                    claim_id, failures = None, 0
                    self._outage.answered()
                for rollout in claimed:
                    task = asyncio.create_task(self._run_one(rollout), name=f"agl-rollout-{rollout.rollout_id}")
                    self._active[rollout.rollout_id] = task
                    task.add_done_callback(lambda _t, rid=rollout.rollout_id: self._active.pop(rid, None))
                started += len(claimed)
                busy = len(self._active.keys() | self._delivering.keys())
                if max_rollouts is not None and started >= max_rollouts and not busy:
                    break
                if until_idle and not claimed and not busy:
                    break
                if self._outage.over():
                    raise self._outage.error()
                await self._wait(self.poll_s)
        finally:
            heartbeat.cancel()
            self._stop_deadline = time.monotonic() + self.stop_grace_s
            await self._cancel_active()
            await self._settle_deliveries()
            try:
                await asyncio.to_thread(self.writer.flush, self._grace_left())
            except StoreUnavailable as exc:
                log.error("runner %s: stopping with observations unwritten: %s", self.runner_id, exc)
        if self._fatal is not None:
            raise self._fatal
        return dict(self.counts)

    def run_sync(self, **kwargs: Any) -> dict[str, int]:
        """:meth:`run` in a fresh event loop (for scripts and threads)."""
        return asyncio.run(self.run(**kwargs))

    def stop(self) -> None:
        """Ask the loop to end. Thread-safe.

        In-flight rollouts are cancelled and their attempt ends ``failed`` with a
        ``RunnerStopped`` error, so the store's retry policy gives them to another runner.
        """
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def close(self) -> None:
        """Release the thread pool and the writer the runner opened (waiting up to ``stop_grace_s``
        for its last writes; what the store did not take by then is logged, not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._own_writer:
            try:
                self.writer.close(timeout_s=self.stop_grace_s)
            except StoreUnavailable as exc:
                log.error("runner %s: closing with observations unwritten: %s", self.runner_id, exc)

    def _fail(self, exc: BaseException) -> None:
        """Stop the runner because of an error that retrying cannot fix; :meth:`run` raises it."""
        if self._fatal is None:
            self._fatal = exc
            log.error("runner %s: stopping: %s", self.runner_id, _one_line(exc))
        if self._stop is not None:
            self._stop.set()

    def _grace_left(self) -> float | None:
        return None if self._stop_deadline is None else max(0.0, self._stop_deadline - time.monotonic())

    async def _settle_deliveries(self) -> None:
        """Wait for the finishes on their way (each gives up at the stop deadline)."""
        while self._delivering:
            await asyncio.gather(*list(self._delivering.values()), return_exceptions=True)

    async def _wait(self, seconds: float) -> None:
        waiters = [asyncio.ensure_future(self._stop.wait())]
        if self._active:
            waiters.append(
                asyncio.ensure_future(asyncio.wait(list(self._active.values()), return_when=asyncio.FIRST_COMPLETED))
            )
        done, pending = await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()

    async def _cancel_active(self) -> None:
        tasks = list(self._active.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            # Rollouts whose finish is on its way still run in the store: their lease is kept too.
            ids = list(self._active.keys() | self._delivering.keys())
            if not ids:
                continue
            try:
                await asyncio.to_thread(self.store.heartbeat, ids, self.runner_id)
                current = await asyncio.to_thread(lambda ids=ids: list(self.store.query_rollouts(rollout_ids=ids)))
            except Exception as exc:
                if not is_transient(exc):
                    self._fail(exc)
                    return
                self._outage.failed(exc, "heartbeat")  # the next beat tries again
                continue
            self._outage.answered()
            for r in current:
                if r.rollout_id in self._delivering:
                    continue  # its finish, on its way, settles it (a no-op or a refusal if it was taken back)
                if r.status != RolloutStatus.RUNNING or r.runner_id != self.runner_id:
                    task = self._active.get(r.rollout_id)
                    if task is not None:
                        log.info(
                            "rollout %s was taken back by the store (%s); stopping it", r.rollout_id, r.status.value
                        )
                        self._taken_back.add(r.rollout_id)
                        task.cancel()

    # -- one rollout -----------------------------------------------------------------------
    def context_for(self, rollout: Rollout) -> RolloutContext:
        """The context an agent gets for ``rollout``."""
        base_url = rollout_base_url(self.gateway_url, rollout.rollout_id) if self.gateway_url else None
        # the rollout's own resources (what an algorithm such as agl-apo chose for it) over the runner's
        resources = {**self.resources, **self.mode_resources.get(rollout.mode, {}), **rollout.resources}
        resources.setdefault("mode", rollout.mode)
        return RolloutContext(
            rollout_id=rollout.rollout_id,
            task=rollout.task,
            base_url=base_url,
            model=self.model,
            api_key=self._key_for(rollout),
            resources=resources,
            writer=self.writer,
        )

    def _key_for(self, rollout: Rollout) -> str:
        if self.rollout_keys is not None:
            return self.rollout_keys.mint(rollout.rollout_id, rollout.attempt)
        from_store = getattr(self.store, "rollout_key", None)
        key = from_store(rollout.rollout_id, rollout.attempt) if from_store is not None else None
        return key or self.api_key

    async def _run_one(self, rollout: Rollout) -> None:
        ctx = self.context_for(rollout)
        timeout = rollout.timeout_s or self.default_timeout_s
        status, error, output, reward = RolloutStatus.SUCCEEDED, None, None, None
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                value = await self._invoke(ctx, rollout)
            output, reward = read_result(value)
            output = _jsonable(output)
            if reward is not None and not math.isfinite(reward):  # no store keeps it (agl.schema)
                status, error = RolloutStatus.FAILED, f"ValueError: reward: the agent returned {reward!r}, not finite"
                reward = None
        except TimeoutError as exc:
            if deadline.expired():
                status, error = (
                    RolloutStatus.TIMED_OUT,
                    f"TimeoutError: the agent ran past the rollout's timeout of {timeout}s",
                )
            else:  # the agent's own TimeoutError (a socket, a client) is a failure like any other
                status, error = RolloutStatus.FAILED, format_error(exc)
        except asyncio.CancelledError:
            # The runner is stopping (or the store took the rollout back, and then it is not finished
            # here): the attempt failed through no fault of the agent, so the retry policy decides.
            status, error = RolloutStatus.FAILED, "RunnerStopped: the runner stopped before the agent finished"
        except Exception as exc:
            status, error = RolloutStatus.FAILED, format_error(exc)
        await self._end(rollout, ctx, status, error, output, reward)

    async def _invoke(self, ctx: RolloutContext, rollout: Rollout) -> Any:
        task_input = rollout.task.input if rollout.task is not None else None
        args = (task_input, ctx) if self._with_ctx else (task_input,)
        if self._async:
            with use_rollout(ctx), self._env(ctx):
                return await self.agent(*args)

        def call() -> Any:
            with use_rollout(ctx), self._env(ctx):
                return self.agent(*args)

        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, context.run, call)

    def _env(self, ctx: RolloutContext):
        if not self.set_env or ctx.base_url is None:
            return contextlib.nullcontext()
        route = ctx.base_url.removesuffix("/v1")  # the anthropic SDK appends /v1/messages itself
        return _environment(
            {
                "OPENAI_BASE_URL": ctx.base_url,
                "OPENAI_API_BASE": ctx.base_url,
                "OPENAI_API_KEY": ctx.api_key,
                "ANTHROPIC_BASE_URL": route,
                "ANTHROPIC_API_URL": route,
                "ANTHROPIC_API_KEY": ctx.api_key,
                ROLLOUT_ID: ctx.rollout_id or "",
            }
        )

    async def _end(
        self,
        rollout: Rollout,
        ctx: RolloutContext,
        status: RolloutStatus,
        error: str | None,
        output: Any,
        reward: float | None,
    ) -> None:
        rid = rollout.rollout_id
        if reward is not None:
            self.writer.put(
                Reward(
                    reward_id=f"rw-{rid}-a{rollout.attempt}-return",
                    rollout_id=rid,
                    value=reward,
                    source=RETURN_SOURCE,
                    seq=ctx.next_seq(),
                )
            )
        # The finish is a task of its own: it goes on (and run() waits for it) even when this
        # task is cancelled, and it never raises, so nothing is left unretrieved.
        delivery = asyncio.ensure_future(self._deliver(rollout, status, error, output))
        self._delivering[rid] = delivery
        delivery.add_done_callback(lambda _t: self._delivering.pop(rid, None))
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(delivery)

    async def _deliver(self, rollout: Rollout, status: RolloutStatus, error: str | None, output: Any) -> None:
        """Write the rollout's observations and record how it ended, retrying while the store is away.

        Gives up (with an error logged) when the store stays away past ``store_outage_s``
        or past the stop deadline, or refuses the finish for good; never raises.
        """
        rid = rollout.rollout_id
        failures = 0
        failing_since: float | None = None  # this finish's own bound: a 5xx may repeat while other calls pass
        try:
            while True:
                if rid in self._taken_back:
                    self._count("taken_back")
                    return
                try:
                    ended = await asyncio.to_thread(self._flush_and_finish, rollout, status, error, output)
                except InvalidTransition as exc:  # the store took it back meanwhile (expired or cancelled)
                    self._outage.answered()
                    log.info("rollout %s: not finished here: %s", rid, exc)
                    self._count("taken_back")
                    return
                except Exception as exc:
                    if isinstance(exc, ValueError) and output is not None:
                        self._outage.answered()
                        log.error("rollout %s: the store refused its output (%s); finishing without it", rid, exc)
                        note = f"the store refused the rollout's output: {_one_line(exc)}"
                        error, output = (f"{error}\n{note}" if error else note), None
                        continue
                    if not is_transient(exc):
                        log.error("rollout %s attempt %d: could not be finished: %s", rid, rollout.attempt, exc)
                        self._count("finish_refused")
                        if isinstance(exc, (PermissionError, Refused)):
                            self._fail(exc)
                        return
                    self._outage.failed(exc, f"finish of {rid}")
                    failing_since = failing_since or time.monotonic()
                    left = self._grace_left()
                    too_long = time.monotonic() - failing_since > self.store_outage_s
                    if self._outage.over() or too_long or left == 0:
                        log.error(
                            "rollout %s attempt %d ended %s but the store did not take it (%s); "
                            "the store's retry policy or expiry decides what happens to it",
                            rid,
                            rollout.attempt,
                            status.value,
                            _one_line(exc),
                        )
                        self._count("undelivered")
                        return
                    failures += 1
                    delay = STORE_RETRY.delay_s(failures)
                    await STORE_RETRY.async_sleep(delay if left is None else min(delay, left))
                    continue
                self._outage.answered()
                self._ended(rollout, status, error, ended)
                return
        except Exception:  # a bug here must not turn into "Task exception was never retrieved"
            log.exception("rollout %s: unexpected error while finishing it", rid)
            self._count("undelivered")

    def _flush_and_finish(self, rollout: Rollout, status: RolloutStatus, error: str | None, output: Any) -> Rollout:
        left = self._grace_left()
        self.writer.flush(timeout_s=_FLUSH_WAIT_S if left is None else min(_FLUSH_WAIT_S, left))
        return self.store.finish(rollout.rollout_id, status, error=error, output=output, attempt=rollout.attempt)

    def _ended(self, rollout: Rollout, status: RolloutStatus, error: str | None, ended: Rollout) -> None:
        rid = rollout.rollout_id
        self._count(status.value)
        if status != RolloutStatus.SUCCEEDED:
            again = " (queued again)" if ended.status == RolloutStatus.QUEUED else ""
            log.warning(
                "rollout %s attempt %d %s%s: %s",
                rid,
                rollout.attempt,
                status.value,
                again,
                (error or "").splitlines()[0] if error else "",
            )

    def _count(self, key: str) -> None:
        with _count_lock:
            self.counts[key] = self.counts.get(key, 0) + 1


_count_lock = threading.Lock()


class _environment:
    """Set environment variables for a block, and put the old values back after."""

    def __init__(self, values: dict[str, str]):
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["Runner", "RolloutResult", "format_error", "load_agent", "read_result", "rollout_base_url"]
