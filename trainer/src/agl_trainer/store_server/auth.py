"""Who may do what on the store server: three scopes, told apart by the bearer credential.

- **admin** (``--admin-token``, ``$AGL_STORE_TOKEN``): every route. The trainer, ``agl rollouts``.
- **runner** (``--runner-token``, ``$AGL_STORE_RUNNER_TOKEN``): what running rollouts needs and
  no more: claim (the answer carries each claimed rollout's key, when the server has the key
  secret), heartbeat, finish, and write spans, LLM calls and rewards of *running* rollouts
  (or of no rollout: production traffic). It may ask the status of rollouts it names by id
  (``/v1/rollouts/query`` with ``rollout_ids``), their output and error left out. It cannot
  enqueue, cancel, expire, read tasks, observations or model versions, or list rollouts.
- **rollout** (a rollout key, :class:`agl.credentials.RolloutKeys`, when the server has the
  secret): its own rollout only, while its attempt runs: write that rollout's spans, LLM
  calls and rewards, heartbeat it, finish it, read it and its task. This is what ``agl run``
  hands its child, so its rewards are the agent's own: any source but the trusted ones
  (:data:`agl.schema.TRUSTED_SOURCES`, the runner's ``return``), which are 403 naming the field,
  and under ids of its own making: the ids agl makes for the runner's and the reward plugins'
  rewards (:data:`agl.schema.ROLLOUT_REWARD_ID`) are 409 naming the id. Neither a rollout key nor
  a runner token (both are what agent code holds) writes a grade of a rollout, a reward of a
  :data:`agl.schema.GRADER_SOURCES` source (``human``, ``user``): 403 naming the field.

Whoever writes, an id belongs to its rollout: the store refuses (409, :class:`agl.errors.IdConflict`)
a span, LLM call or reward whose id is stored under another rollout.

A refused route is 403 naming the scope; an observation of another rollout is 403 naming
the rollout. That a rollout runs is asked of the store (or learnt from a claim) and kept
``status_ttl_s`` (1 s) in the cache the gateway keeps too
(:class:`agl_trainer.http.running.RunningRollouts`), so a key stops working at most that long
after its attempt ended; a rollout found not running is asked again next time, so a claim
opens it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import anyio.to_thread
from starlette.responses import JSONResponse

from agl.credentials import RolloutKeys, bearer_of, same_token
from agl.errors import IdConflict
from agl.schema import GRADER_SOURCES, ROLLOUT_REWARD_ID, TRUSTED_SOURCES, RolloutStatus
from agl.store.base import Store
from agl_trainer.http.bearer import ADMIN, ROLLOUT, Caller, caller_by_bearer
from agl_trainer.http.running import RunningRollouts, expired_reason

RUNNER = "runner"
"""The runner token's scope (beside :data:`ADMIN` and :data:`ROLLOUT`)."""

_RUNNER_ROUTES = frozenset(
    {
        ("POST", "/v1/claims"),
        ("POST", "/v1/heartbeats"),
        ("POST", "/v1/batch"),
        ("POST", "/v1/spans"),
        ("POST", "/v1/llm_calls"),
        ("POST", "/v1/rewards"),
        ("GET", "/v1/rollouts/query"),
        ("POST", "/v1/rollouts/query"),
    }
)
_ROLLOUT_ROUTES = frozenset(
    {
        ("POST", "/v1/heartbeats"),
        ("POST", "/v1/batch"),
        ("POST", "/v1/spans"),
        ("POST", "/v1/llm_calls"),
        ("POST", "/v1/rewards"),
    }
)


class Refused(Exception):
    """A request outside its caller's scope (403), or with a credential that no longer works (401)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _is_finish(method: str, path: str) -> bool:
    return method == "POST" and path.startswith("/v1/rollouts/") and path.endswith("/finish")


def _is_rollout_read(method: str, path: str) -> bool:
    """``GET /v1/rollouts/{id}`` or ``GET /v1/tasks/{id}`` (which rollout or task: checked by the route)."""
    if method != "GET":
        return False
    if path.startswith("/v1/rollouts/"):
        return path != "/v1/rollouts/query" and not path.endswith("/attempts")
    return path.startswith("/v1/tasks/") and path != "/v1/tasks/query"


class StoreAuth:
    """Tells callers apart, refuses routes outside their scope, and checks what they write."""

    def __init__(
        self,
        store: Store,
        *,
        token: str,
        runner_token: str | None = None,
        keys: RolloutKeys | None = None,
        status_ttl_s: float = 1.0,
        max_cached: int = 100_000,
    ):
        if not token:
            raise ValueError("token: the store server needs a non-empty bearer token")
        if runner_token is not None and same_token(runner_token, token):
            raise ValueError("runner_token: must differ from the admin token")
        self.store = store
        self.token = token
        self.runner_token = runner_token
        self.keys = keys
        self.running = RunningRollouts(ttl_s=status_ttl_s, max_cached=max_cached)

    # -- who ---------------------------------------------------------------------------
    def identify(self, headers: Iterable[tuple[bytes, bytes]]) -> Caller | None:
        """The caller, or None for a missing or wrong credential."""
        given = bearer_of(headers)
        if given is None:
            return None
        return caller_by_bearer(given, {ADMIN: self.token, RUNNER: self.runner_token}, self.keys)

    def allows_route(self, caller: Caller, method: str, path: str) -> bool:
        """Whether the route is in the caller's scope (what it may send there is checked later)."""
        if caller.scope == ADMIN:
            return True
        if caller.scope == RUNNER:
            return (method, path) in _RUNNER_ROUTES or _is_finish(method, path)
        return (method, path) in _ROLLOUT_ROUTES or _is_finish(method, path) or _is_rollout_read(method, path)

    # -- what --------------------------------------------------------------------------
    def check_live(self, caller: Caller) -> None:
        """A rollout key works only while its attempt runs (401 once it ended)."""
        if caller.scope != ROLLOUT:
            return
        status, attempt = self._statuses([caller.rollout_id]).get(caller.rollout_id, (None, None))
        reason = expired_reason(caller.rollout_id, caller.attempt, status, attempt)
        if reason is not None:
            raise Refused(401, reason)

    def check_rollout(self, caller: Caller, rollout_id: str | None, what: str) -> None:
        """``what`` names ``rollout_id``: refused unless the caller may touch that rollout."""
        if caller.scope == ROLLOUT and rollout_id != caller.rollout_id:
            raise Refused(403, f"{what}: a rollout key is for its own rollout only, not {rollout_id!r}")

    def check_observations(self, caller: Caller, items: Iterable[Any], field: str) -> None:
        """Spans, LLM calls or rewards a caller writes: a rollout key's own rollout; a runner's
        running rollouts (or none: production traffic)."""
        if caller.scope == ADMIN:
            return
        ids = {item.rollout_id for item in items}
        if caller.scope == ROLLOUT:
            for rid in ids:
                self.check_rollout(caller, rid, field)
            if field == "rewards":
                _check_agent_rewards(items)
            return
        if field == "rewards":
            _check_grades(items, "runner token")
        ids.discard(None)
        if not ids:
            return
        statuses = self._statuses(sorted(ids))
        for rid in sorted(ids):
            status = statuses.get(rid)
            if status is None or status[0] != RolloutStatus.RUNNING:
                state = "unknown" if status is None else status[0].value
                raise Refused(403, f"{field}: rollout {rid!r} is {state}: a runner writes only running rollouts")

    def _statuses(self, rollout_ids: list[str]) -> dict[str, tuple[RolloutStatus, int]]:
        """``{rollout_id: (status, attempt)}`` for the known ones, from the cache or the store."""
        out: dict[str, tuple[RolloutStatus, int]] = {}
        missing = []
        for rid in rollout_ids:
            attempt = self.running.attempt(rid)
            if attempt is None:
                missing.append(rid)
            else:
                out[rid] = (RolloutStatus.RUNNING, attempt)
        if missing:
            for r in self.store.query_rollouts(rollout_ids=missing):
                out[r.rollout_id] = (r.status, r.attempt)
                self.running.remember(r.rollout_id, r.status, r.attempt)
        return out

    def claim_keys(self, rollouts: Iterable[Any]) -> dict[str, str] | None:
        """The key of each claimed rollout, for the claim's answer (None without a secret)."""
        rollouts = list(rollouts)
        for r in rollouts:
            self.running.remember(r.rollout_id, RolloutStatus.RUNNING, r.attempt)  # just claimed
        if self.keys is None:
            return None
        return {r.rollout_id: self.keys.mint(r.rollout_id, r.attempt) for r in rollouts}


def _check_agent_rewards(rewards: Iterable[Any]) -> None:
    """Rewards a rollout key writes: an agent's own sources only (see :data:`agl.schema.TRUSTED_SOURCES`),
    and none of the ids agl makes for the runner and the reward plugins (:data:`agl.schema.ROLLOUT_REWARD_ID`)."""
    for i, reward in enumerate(rewards):
        if ROLLOUT_REWARD_ID.fullmatch(reward.reward_id):
            raise IdConflict(f"rewards[{i}].reward_id", reward.reward_id, "is of the form agl makes for the runner")
        if reward.source in TRUSTED_SOURCES:
            raise Refused(
                403,
                f"rewards[{i}].source: a rollout key may not write a {reward.source!r} reward "
                "(the runner writes the agent function's returned reward)",
            )
    _check_grades(rewards, "rollout key")


def _check_grades(rewards: Iterable[Any], credential: str) -> None:
    """A grade of a rollout (:data:`agl.schema.GRADER_SOURCES`) comes from a credential no agent holds."""
    for i, reward in enumerate(rewards):
        if reward.rollout_id is not None and reward.source in GRADER_SOURCES:
            raise Refused(
                403,
                f"rewards[{i}].source: a {credential} may not write a {reward.source!r} reward of a rollout: a "
                "grade counts as a human's or a user's only from a credential agents do not hold (the admin "
                "token: `agl rollouts reward`, the dashboard); an agent's own rewards keep a source of their own",
            )


def redacted(rollout: Any) -> Any:
    """A rollout as a runner may see one it did not claim in this request: no output, error or task."""
    return rollout.model_copy(update={"output": None, "error": None, "task": None})


def caller_of(scope: dict) -> Caller:
    """Who sent the request (set by :class:`BearerAuth`; the admin for an app used without it)."""
    return scope.get("agl.caller") or _ADMIN_CALLER


_ADMIN_CALLER = Caller(ADMIN)


class BearerAuth:
    """ASGI middleware: every HTTP request but those under ``open_paths`` needs a credential,
    and gets only the routes of its scope (see this module)."""

    def __init__(
        self,
        app: Any,
        token: str,
        open_paths: frozenset[str] = frozenset({"/healthz"}),
        fast_routes: dict[tuple[str, str], Callable[..., Any]] | None = None,
        auth: StoreAuth | None = None,
    ):
        if not token:
            raise ValueError("token: the store server needs a non-empty bearer token")
        self.app = app
        self.auth = auth or StoreAuth(None, token=token)  # type: ignore[arg-type]
        self.open_paths = open_paths
        self.fast_routes = fast_routes or {}  # (method, path) -> a plain ASGI handler, past the token check

    async def _refuse(self, scope, receive, send, status: int, reason: str) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        kind = "Unauthorized" if status == 401 else "Forbidden"
        response = JSONResponse(
            {"error": {"type": kind, "field": "Authorization", "reason": reason}}, status_code=status, headers=headers
        )
        await response(scope, receive, send)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            caller = self.auth.identify(scope["headers"])
            if caller is None:
                given = any(name == b"authorization" for name, _ in scope["headers"])
                reason = "wrong bearer token" if given else "missing bearer token"
                return await self._refuse(scope, receive, send, 401, reason)
            if not self.auth.allows_route(caller, scope["method"], scope["path"]):
                reason = f"{scope['method']} {scope['path']} is outside the {caller.scope} scope of this credential"
                return await self._refuse(scope, receive, send, 403, reason)
            if caller.rollout_id is not None:
                try:
                    await anyio.to_thread.run_sync(self.auth.check_live, caller)
                except Refused as exc:
                    return await self._refuse(scope, receive, send, exc.status, exc.reason)
            scope["agl.caller"] = caller
            fast = self.fast_routes.get((scope["method"], scope["path"]))
            if fast is not None:
                await fast(scope, receive, send)
                return
        await self.app(scope, receive, send)
