"""The store interface: the only thing runners, the gateway and trainers share.

Every backend (embedded SQLite, PostgreSQL, the HTTP client) implements
:class:`Store` and passes the same test suite. Methods are synchronous and
thread-safe; asyncio callers wrap them in ``asyncio.to_thread``.

Writes are idempotent by id: adding a span, LLM call, reward or task whose id is
already stored is a no-op, so a retried write is never stored twice. A claim
carries a ``claim_id`` for the same reason.

A span, LLM call or reward that arrives after its rollout ended is stored like
any other: late data is kept, never dropped, and is part of every later query.
"""

from __future__ import annotations

import abc
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

from agl.env import STORE_URL
from agl.errors import ConfigError
from agl.schema import LLMCall, ModelVersion, Reward, Rollout, RolloutStatus, Span, StoreStats, Task
from agl.store.batch import BatchWrites
from agl.store.bulk import BulkReads
from agl.store.listing import ListingReads


class RolloutQuery(TypedDict, total=False):
    """The filters of :meth:`Store.query_rollouts`, each None (matching every rollout) when left out."""

    task_id: str | None
    status: RolloutStatus | Sequence[RolloutStatus] | None
    step: int | None
    since: float | None
    """Created at or after (epoch seconds)."""
    until: float | None
    """Created before (epoch seconds)."""
    rollout_ids: Sequence[str] | None


class SpanQuery(TypedDict, total=False):
    """The filters of :meth:`Store.query_spans`: None (or False for ``production``) when left out."""

    rollout_id: str | None
    rollout_ids: Sequence[str] | None
    kind: str | None
    production: bool
    """Only the spans of no rollout."""
    since: float | None
    """Started at or after (epoch seconds)."""
    until: float | None
    """Started before (epoch seconds)."""


class LLMCallQuery(TypedDict, total=False):
    """The filters of :meth:`Store.query_llm_calls`: None (or False for ``production``) when left out."""

    rollout_id: str | None
    rollout_ids: Sequence[str] | None
    call_ids: Sequence[str] | None
    production: bool
    """Only the records of no rollout."""


class RewardQuery(TypedDict, total=False):
    """The filters of :meth:`Store.query_rewards`: None (or False for ``production``) when left out."""

    rollout_id: str | None
    rollout_ids: Sequence[str] | None
    production: bool
    """Only the rewards of no rollout."""


class FinishOptions(TypedDict, total=False):
    """The options of :meth:`Store.finish`, each None when left out."""

    error: str | None
    output: object
    """The rollout's output: anything JSON can hold."""
    attempt: int | None


_OPTION_DEFAULTS: dict[str, Any] = {"production": False}


def with_defaults(options: type[Mapping[str, Any]], given: Mapping[str, Any], method: str) -> dict[str, Any]:
    """Every key of the TypedDict ``options``, in its order, with ``given``'s value or its default.

    Raises :class:`TypeError`, as Python does for a keyword argument ``method`` does
    not take, where ``given`` holds a key the TypedDict has not.
    """
    names = options.__annotations__
    for name in given:
        if name not in names:
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
    return {name: given.get(name, _OPTION_DEFAULTS.get(name)) for name in names}


class Store(BatchWrites, BulkReads, ListingReads, abc.ABC):
    """Tasks, rollouts, spans, LLM call records, rewards and model versions.

    Besides the abstract methods every backend implements, the interface has methods with a
    default that works on any backend through the ones above, only slower, and that a backend
    may implement better: the batched writes (:class:`~agl.store.batch.BatchWrites`), the bulk
    reads of building transitions (:class:`~agl.store.bulk.BulkReads`) and the dashboard's reads
    (:class:`~agl.store.listing.ListingReads`, and :meth:`count_spans`).
    """

    # -- tasks ---------------------------------------------------------------------
    @abc.abstractmethod
    def add_tasks(self, tasks: Iterable[Task]) -> None:
        """Store tasks; a task whose id is already stored is left as it is."""

    @abc.abstractmethod
    def get_task(self, task_id: str) -> Task:
        """The task with this id; raises :class:`agl.errors.NotFound`."""

    @abc.abstractmethod
    def query_tasks(self, *, split: str | None = None) -> Iterator[Task]:
        """Tasks in insertion order, optionally of one split."""

    # -- rollouts ------------------------------------------------------------------
    @abc.abstractmethod
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Queue rollouts (their tasks must be stored). Idempotent by rollout id."""

    @abc.abstractmethod
    def claim(self, runner_id: str, *, limit: int = 1, claim_id: str | None = None) -> list[Rollout]:
        """Atomically move up to ``limit`` queued rollouts to running for this runner.

        No two claims ever get the same rollout. Claimed rollouts come with their
        task. Repeating a claim with the same ``claim_id`` returns what that claim
        got the first time instead of claiming more.
        """

    @abc.abstractmethod
    def heartbeat(self, rollout_ids: Sequence[str], runner_id: str) -> None:
        """Record that the runner is still working on these rollouts."""

    @abc.abstractmethod
    def finish(self, rollout_id: str, status: RolloutStatus, **options: Unpack[FinishOptions]) -> Rollout:
        """End the current attempt of a running rollout, keeping ``error`` and ``output`` (:class:`FinishOptions`).

        A ``failed`` or ``timed_out`` attempt with attempts left puts the rollout
        back in the queue (the retry policy); the returned rollout shows which.
        Finishing an already finished rollout with the same status is a no-op.

        ``attempt`` is the attempt the caller ran (``Rollout.attempt`` as its claim
        returned it). Given, a finish that arrives after that attempt ended (it timed
        out and the rollout went back to the queue, perhaps to another runner)
        raises :class:`~agl.errors.InvalidTransition` and changes nothing, unless it
        repeats the status the attempt ended with (a retried call: a no-op).
        """

    @abc.abstractmethod
    def cancel(self, rollout_ids: Sequence[str]) -> None:
        """Cancel rollouts that have not finished."""

    @abc.abstractmethod
    def expire(self, *, heartbeat_timeout_s: float, now: float | None = None) -> list[Rollout]:
        """Time out running rollouts past their timeout or silent past the heartbeat timeout.

        Each goes back to the queue if it has attempts left, else ends ``timed_out``.
        """

    @abc.abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout:
        """The rollout with this id; raises :class:`agl.errors.NotFound`."""

    @abc.abstractmethod
    def query_rollouts(self, **query: Unpack[RolloutQuery]) -> Iterator[Rollout]:
        """Rollouts matching every given filter (:class:`RolloutQuery`), oldest first, streamed."""

    @abc.abstractmethod
    def attempts(self, rollout_id: str) -> list:
        """The :class:`agl.schema.Attempt` records of a rollout, first to last."""

    def wait(
        self, rollout_ids: Sequence[str], *, timeout_s: float | None = None, poll_s: float = 0.05
    ) -> list[Rollout]:
        """Block until every rollout has ended (or the timeout passes); return them."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(rollout_ids)
        done: dict[str, Rollout] = {}
        while True:
            for rollout in self.query_rollouts(rollout_ids=pending):
                if rollout.status.terminal:
                    done[rollout.rollout_id] = rollout
            pending = [r for r in pending if r not in done]
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(poll_s)
        ended = [done[r] for r in rollout_ids if r in done]
        return ended + [self.get_rollout(r) for r in pending]

    # -- observations --------------------------------------------------------------
    @abc.abstractmethod
    def add_spans(self, spans: Iterable[Span]) -> None:
        """Store spans; idempotent by ``(span_id)``."""

    @abc.abstractmethod
    def add_llm_calls(self, calls: Iterable[LLMCall]) -> None:
        """Store gateway records; idempotent by ``call_id``."""

    @abc.abstractmethod
    def add_rewards(self, rewards: Iterable[Reward]) -> None:
        """Store rewards; idempotent by ``reward_id``."""

    @abc.abstractmethod
    def query_spans(self, **query: Unpack[SpanQuery]) -> Iterator[Span]:
        """Spans matching every given filter (:class:`SpanQuery`) in order of ``(rollout, seq)``, streamed.
        ``production`` selects spans of no rollout."""

    @abc.abstractmethod
    def query_llm_calls(self, **query: Unpack[LLMCallQuery]) -> Iterator[LLMCall]:
        """Gateway records matching every given filter (:class:`LLMCallQuery`) in order of ``(rollout, seq)``,
        streamed."""

    @abc.abstractmethod
    def query_rewards(self, **query: Unpack[RewardQuery]) -> Iterator[Reward]:
        """Rewards matching every given filter (:class:`RewardQuery`) in order of ``(rollout, seq)``, streamed."""

    # -- model versions ------------------------------------------------------------
    @abc.abstractmethod
    def add_model_version(self, version: ModelVersion) -> None:
        """Register a model version; registering the same version again is a no-op."""

    @abc.abstractmethod
    def get_model_version(self, version: str) -> ModelVersion:
        """The model version with this name; raises :class:`agl.errors.NotFound`."""

    @abc.abstractmethod
    def latest_model_version(self) -> ModelVersion | None:
        """The most recently registered model version, if any."""

    # -- step records ---------------------------------------------------------------
    def add_step_record(self, run_id: str, record: dict) -> None:
        """Store one training step's metrics record (a line of the trainer's ``metrics.jsonl``,
        with its ``kind`` and ``step``), for the dashboard's runs page. Idempotent by
        ``(run_id, kind, step)``. A store that keeps no step records ignores it."""

    def step_records(self, run_id: str | None = None) -> list[dict]:
        """The step records stored (of one run, or all), oldest first, each with its ``run_id``."""
        return []

    # -- the settings and defaults a backend may override -------------------------------
    max_wait_s: float | None = None
    """How long a call retries a transient failure (a locked database) before it fails with
    :class:`~agl.errors.StoreUnavailable`; None leaves it to the store's retry count. A store
    that does not retry ignores it."""

    def count_spans(self, **query: Unpack[SpanQuery]) -> int:
        """How many spans match every given filter (:class:`SpanQuery`). The default counts :meth:`query_spans`."""
        return sum(1 for _ in self.query_spans(**query))

    # -- the rest ------------------------------------------------------------------
    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """Counts of what the store holds."""

    def flush(self) -> None:
        """Make every acknowledged write durable. A no-op where writes already are."""

    def close(self) -> None:
        """Release connections and threads."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


DEFAULT_STORE_URL = "sqlite:///.agl/agl.db"
"""The store every command and the trainer use when neither a URL nor ``AGL_STORE_URL`` names one."""

_SQLITE_FORMS = "sqlite:///relative/path.db or sqlite:////absolute/path.db"


def step_record_row(run_id: str, record: dict) -> tuple[str, str, int, str]:
    """``(run_id, kind, step, JSON body)`` of a step record (NaN and infinities as null); a ValueError
    naming the field for a bad one."""
    import json
    import math

    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id: must be a non-empty string")
    kind, step = record.get("kind", "train"), record.get("step")
    if not isinstance(kind, str) or not kind:
        raise ValueError("kind: must be a non-empty string")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"step: must be an integer, got {step!r}")
    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    try:
        body = json.dumps(finite, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"record: not JSON ({exc})") from None
    return run_id, kind, step, body


def default_store_url() -> str:
    """``$AGL_STORE_URL``, else :data:`DEFAULT_STORE_URL` (``.agl/agl.db`` in the current directory)."""
    return STORE_URL.get() or DEFAULT_STORE_URL


def store_url_scheme(url: str | os.PathLike[str] | None) -> tuple[str, str]:
    """The store URL (:func:`default_store_url` when none is given) and its scheme (``sqlite`` for a plain path)."""
    url = os.fspath(url) if url else default_store_url()
    return url, url.split("://", 1)[0].lower() if "://" in url else "sqlite"


def open_store(url: str | os.PathLike[str] | None = None, *, create: bool = True, **options) -> Store:
    """Open a store from a URL.

    - ``sqlite:///relative/agl.db``, ``sqlite:////abs/agl.db`` or a plain path: embedded SQLite
      (``~`` is expanded);
    - ``http://127.0.0.1:4317`` (token in ``options`` or ``AGL_STORE_TOKEN``): a store server;
    - ``postgresql://user@host/db``: PostgreSQL;
    - any other ``scheme://``: the opener a plugin registers for it (hook
      ``agl_register_store_schemes``), called as ``opener(url, **options)``.

    The three above are registered the same way, by :mod:`agl.store.schemes`, and
    are found without loading any installed plugin; :func:`agl.store.open_store` (the
    same function for a caller) opens them without loading the plugin registry at all.

    With no URL, :func:`default_store_url` names the store. ``create=False`` is for
    readers: a SQLite file that does not exist is a :class:`~agl.errors.ConfigError`
    (``no such store: PATH``) instead of a new, empty store; other schemes open as usual.
    Raises :class:`~agl.errors.ConfigError` for a scheme nothing opens, listing the known ones.
    """
    from agl.plugins import resolve

    url, scheme = store_url_scheme(url)
    opener = resolve("store_scheme", scheme, field=f"store url {url!r}")
    return opener(url, **({"create": create} if scheme == "sqlite" else {}), **options)


def sqlite_path(url: str | os.PathLike[str]) -> Path:
    """The file a ``sqlite:///`` URL (or a plain path) names, ``~`` expanded.

    Raises :class:`~agl.errors.ConfigError` naming the expected forms for a URL with
    no path (``sqlite:///``) or with too few slashes (``sqlite:/x.db``, ``sqlite://x.db``).
    """
    text = os.fspath(url)
    if text.lower().startswith("sqlite:"):
        path = text[len("sqlite:///") :] if text.lower().startswith("sqlite:///") else ""
        if not path or path == "/":
            raise ConfigError(f"store url {text!r}: a sqlite url is {_SQLITE_FORMS}")
        text = path  # as in SQLAlchemy: sqlite:////abs/path, sqlite:///rel/path
    return Path(text).expanduser()


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The ``sqlite:///`` URL of a file, made absolute (so that another working directory finds it too)."""
    return f"sqlite:///{Path(path).expanduser().resolve()}"
