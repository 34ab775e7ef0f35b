"""Serving the store server: in a thread of this process (:class:`ServerThread`) or until
interrupted (:func:`serve`, what ``agl store serve`` runs), with the expiry of silent
runners' rollouts beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agl.errors import StoreUnavailable
from agl.store.base import Store
from agl_trainer.http import DEFAULT_HEADER_TIMEOUT_S, BackgroundServer, http_protocol
from agl_trainer.store_server.app import create_app
from agl_trainer.store_server.expiry import DEFAULT_HEARTBEAT_TIMEOUT_S, Expirer
from agl_trainer.store_server.expiry import DEFAULT_INTERVAL_S as DEFAULT_EXPIRE_EVERY_S

START_TIMEOUT_S = 10.0
"""How long :meth:`ServerThread.start` waits for the server to listen."""
STOP_TIMEOUT_S = 10.0
"""How long :meth:`ServerThread.stop` waits for the requests in flight."""


def _expirer(store: Store, expire_every_s: float | None, heartbeat_timeout_s: float) -> Expirer | None:
    """The server's expiry of silent runners' rollouts (see :mod:`.expiry`); None turns it off."""
    if expire_every_s is None or expire_every_s == 0:
        return None
    return Expirer(store, interval_s=expire_every_s, heartbeat_timeout_s=heartbeat_timeout_s)


class ServerThread(BackgroundServer):
    """A store server in a background thread of this process (tests, embedding).

    ``with ServerThread(store, token=...) as server:`` starts uvicorn on
    ``host``:``port`` (port 0 picks a free one; ``server.url`` tells it, before the
    start too) and stops it on exit. ``middleware`` wraps the ASGI app (fault injection
    in tests); ``app_options`` go to :func:`~agl_trainer.store_server.app.create_app`.
    Every ``expire_every_s`` (None or 0: never) rollouts whose runner has not sent a
    heartbeat for ``heartbeat_timeout_s`` are taken back (:mod:`.expiry`). A connection whose
    request headers are not all in within ``header_timeout_s`` is closed (None: never).
    """

    def __init__(
        self,
        store: Store,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        middleware: Callable[[Any], Any] | None = None,
        expire_every_s: float | None = DEFAULT_EXPIRE_EVERY_S,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S,
        **app_options: Any,
    ):
        self.token = token
        self.app = create_app(store, token=token, **app_options)
        served = self.app if middleware is None else middleware(self.app)
        super().__init__(
            served, host=host, port=port, name="agl-store-server", loop="asyncio", header_timeout_s=header_timeout_s
        )
        self.expirer = _expirer(store, expire_every_s, heartbeat_timeout_s)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ServerThread:
        """Serve; returns once the server listens (StoreUnavailable if it does not)."""
        try:
            super().start(timeout_s)
        except RuntimeError as exc:
            raise StoreUnavailable(f"store server on {self.url} did not start: {exc.__cause__ or 'timed out'}") from exc
        if self.expirer is not None:
            self.expirer.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the expiry and the server, then the app's batch threads."""
        if self.expirer is not None:
            self.expirer.stop()
        super().stop(timeout_s)
        self.app.close()


def serve(
    store: Store,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 4317,
    expire_every_s: float | None = DEFAULT_EXPIRE_EVERY_S,
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
    header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S,
    **app_options: Any,
) -> None:
    """Serve ``store`` on ``host``:``port`` until interrupted (uvloop and httptools where installed).

    Every ``expire_every_s`` (None or 0: never) rollouts whose runner has not sent a
    heartbeat for ``heartbeat_timeout_s`` are taken back (:mod:`.expiry`). A connection whose
    request headers are not all in within ``header_timeout_s`` is closed (None: never).
    """
    import uvicorn

    http = http_protocol("auto", header_timeout_s)
    app = create_app(store, token=token, **app_options)
    expirer = _expirer(store, expire_every_s, heartbeat_timeout_s)
    if expirer is not None:
        expirer.start()
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=5,
            http=http,
            ws="none",
        )
    finally:
        if expirer is not None:
            expirer.stop()
        app.close()
