"""The :class:`Gateway`: the model gateway run in a background thread of the caller's process."""

from __future__ import annotations

from typing import Literal

from agl.capture.writer import BufferedWriter
from agl.credentials import RolloutKeys, new_token
from agl.runner import rollout_base_url
from agl.store.base import Store
from agl_trainer.gateway.app import GatewayApp
from agl_trainer.gateway.pause import PauseGate
from agl_trainer.gateway.recorder import Recorder
from agl_trainer.gateway.rollouts import RolloutRegistry
from agl_trainer.gateway.routing import Router
from agl_trainer.http import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BackgroundServer
from agl_trainer.http.header_timeout import check_header_timeout
from agl_trainer.policy_routes import Routes

UVICORN_OPTIONS = {
    "loop": "auto",  # uvloop where installed
    "http": "auto",  # httptools where installed
    "proxy_headers": False,
    "timeout_keep_alive": 60,
    "backlog": 4096,
    "timeout_graceful_shutdown": 10,
}
"""How the gateway's uvicorn serves: its clients keep connections open and come many at once."""


class Gateway:
    """An OpenAI-compatible gateway in front of engine replicas that records every call's token ids.

    >>> gw = Gateway(store, upstreams=["http://127.0.0.1:8000/v1"], token="secret")
    >>> gw.start()
    >>> key = gw.rollout_key(rollout.rollout_id, rollout.attempt)   # a claimed, running rollout
    >>> client = openai.OpenAI(base_url=gw.rollout_base_url(rollout.rollout_id), api_key=key)

    Three credentials (see :mod:`agl_trainer.gateway.auth`): ``token`` for production
    traffic (calls of no rollout), ``admin_token`` for the ``/admin`` routes, and
    per-rollout keys made under ``keys`` (a :class:`~agl.credentials.RolloutKeys`; the
    store server or whoever claims rollouts must make keys under the same secret). Each
    is random when None, readable as ``gw.token``, ``gw.admin_token``, ``gw.keys``.
    ``max_in_flight`` bounds requests per replica; beyond it clients get 429.
    ``max_body_bytes`` bounds a request body (413 beyond); a connection whose request headers
    are not all in within ``header_timeout_s`` seconds is closed (None: never).
    ``engine_logprobs`` says what the engines' ``logprobs`` are: ``raw`` (with the sampled
    ones in ``behaviour_logprobs`` where an engine gives them) or ``behaviour`` (vLLM with
    ``--logprobs-mode processed_logprobs``); calls record each kind in its own field.
    ``status_ttl_s`` is how long the gateway trusts what the store said about a
    rollout's attempt: a key stops working at most that long after its attempt ended.
    ``routes`` (a run's policies, :class:`~agl_trainer.policy_routes.Routes`) sends each call to the
    policy its requested model names and records that policy and its version on the call; a
    model no policy answers is a 404. None: every call goes to what the engines serve by default.
    """

    def __init__(
        self,
        store: Store,
        upstreams: list[str],
        *,
        token: str | None = None,
        admin_token: str | None = None,
        keys: RolloutKeys | None = None,
        status_ttl_s: float = 1.0,
        host: str = "127.0.0.1",
        port: int = 0,
        max_in_flight: int = 512,
        upstream_api_key: str | None = None,
        model_version: str | None = None,
        writer: BufferedWriter | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        engine_logprobs: Literal["raw", "behaviour"] = "raw",
        header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S,
        routes: Routes | None = None,
    ):
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes: must be positive, got {max_body_bytes}")
        self.max_body_bytes = max_body_bytes
        self.header_timeout_s = check_header_timeout(header_timeout_s)
        self.store = store
        self.token = token if token is not None else new_token(24)
        self.admin_token = admin_token if admin_token is not None else new_token(24)
        if self.admin_token == self.token:
            raise ValueError("admin_token: must differ from the gateway token that production clients hold")
        self.keys = keys if keys is not None else RolloutKeys.generate()
        self.host = host
        self.port = port
        self._own_writer = writer is None
        self.writer = writer or BufferedWriter(store)
        self.router = Router(list(upstreams), max_in_flight=max_in_flight, api_key=upstream_api_key)
        self.recorder = Recorder(self.writer, engine_logprobs)
        self.recorder.model_version = model_version
        self.registry = RolloutRegistry(store, status_ttl_s=status_ttl_s)
        self.routes = routes
        """The run's policies (:class:`agl_trainer.policy_routes.Routes`): each call goes to the one its
        requested model names, and is recorded with that policy and its version."""
        self._gate: PauseGate | None = None
        self.app: GatewayApp | None = None
        self._server: BackgroundServer | None = None

    # -- life cycle --------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> Gateway:
        """Serve in a background thread; returns once the gateway is listening."""
        if self._server is not None:
            raise RuntimeError("the gateway is already started")
        self._gate = PauseGate()
        self.app = GatewayApp(
            router=self.router,
            recorder=self.recorder,
            registry=self.registry,
            gate=self._gate,
            token=self.token,
            admin_token=self.admin_token,
            keys=self.keys,
            flush=self.writer.flush,
            routes=self.routes,
        )
        self.app.max_body_bytes = self.max_body_bytes
        server = BackgroundServer(
            self.app,
            host=self.host,
            port=self.port,
            name="agl-gateway",
            setup=self._prime,
            teardown=self.router.close,
            header_timeout_s=self.header_timeout_s,
            **UVICORN_OPTIONS,
        )
        self.port = server.port
        try:
            server.start(timeout_s)
        except RuntimeError as exc:
            raise RuntimeError(f"the gateway did not start: {exc.__cause__ or 'timed out'}") from exc
        self._server = server
        return self

    async def _prime(self) -> None:
        """Learn what the replicas serve; a replica that is down is asked again later."""
        await self.app.served_model()

    def stop(self) -> None:
        """Stop serving and write out every recorded call."""
        if self._server is None:
            return
        self._server.call_soon(self._gate.resume)  # held requests are answered, not stranded
        self._server.stop(30)
        self._server = None
        if self._own_writer:
            self.writer.close()
        else:
            self.writer.flush()

    def flush(self) -> None:
        """Return once every call recorded so far is in the store."""
        self.writer.flush()

    def __enter__(self) -> Gateway:
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL for production traffic (calls of no rollout)."""
        return f"{self.url}/v1"

    def rollout_base_url(self, rollout_id: str) -> str:
        """The OpenAI base URL an agent uses inside one rollout."""
        return rollout_base_url(self.url, rollout_id)

    def rollout_anthropic_url(self, rollout_id: str) -> str:
        """The Anthropic base URL an agent uses inside one rollout (``ANTHROPIC_BASE_URL``: the
        ``anthropic`` SDK appends ``/v1/messages`` itself)."""
        return rollout_base_url(self.url, rollout_id).removesuffix("/v1")

    def rollout_key(self, rollout_id: str, attempt: int) -> str:
        """The key of attempt ``attempt`` of a rollout: the agent's api key while that attempt runs."""
        return self.keys.mint(rollout_id, attempt)

    # -- control ---------------------------------------------------------------------------
    @property
    def model_version(self) -> str | None:
        """The model version recorded on every call from now on."""
        return self.recorder.model_version

    @model_version.setter
    def model_version(self, version: str | None) -> None:
        if self.app is not None and self._server is not None:
            self._call(_apply(self.app.set_model_version, version))
        else:
            self.recorder.model_version = version

    def _call(self, coro, timeout_s: float | None = None):
        if self._server is None:
            coro.close()
            raise RuntimeError("the gateway is not started")
        return self._server.call(coro, timeout_s)

    def pause(self, timeout_s: float | None = None) -> bool:
        """Hold new requests; return once in-flight ones finished (False if ``timeout_s`` passed first)."""
        return self._call(self._gate.pause(timeout_s))

    def resume(self) -> None:
        """Let held and new requests through."""
        self._server.call_soon(self._gate.resume)

    @property
    def paused(self) -> bool:
        return self._gate is not None and self._gate.paused

    def set_upstreams(self, upstreams: list[str]) -> None:
        """Replace the engine replicas; requests in flight finish where they are."""

        async def swap() -> None:
            for replica in self.router.set_upstreams(list(upstreams)):
                await replica.pool.close()
            await self.app.served_model()

        if self._server is None:
            self.router.set_upstreams(list(upstreams))
        else:
            self._call(swap())

    def status(self) -> dict:
        """In flight, paused, model version, replicas."""
        return self._call(_status(self.app))


async def _apply(fn, *args):
    return fn(*args)


async def _status(app: GatewayApp) -> dict:
    return app.status()
