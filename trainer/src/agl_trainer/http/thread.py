"""ASGI apps served by uvicorn in a background thread of this process: :class:`BackgroundServer`."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from agl_trainer.http.header_timeout import DEFAULT_HEADER_TIMEOUT_S, http_protocol

STARTED_POLL_S = 0.005
"""How often the loop looks whether every server is listening, while they start."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (IPv6 when ``host`` has a colon; port 0: a free one)."""
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # whose proto says TCP; with it on, an answer's body waits ~40 ms for the ACK of its headers.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class BackgroundServer:
    """ASGI apps served by uvicorn on one event loop in a daemon thread.

    >>> server = BackgroundServer([app], port=0).start()   # returns once every app listens
    >>> server.url                                           # http://127.0.0.1:<the free port>
    >>> server.stop()

    The sockets are bound at once (port 0 picks a free one; several apps take ``port``,
    ``port + 1``, ..., or free ones), so ``port`` and ``url`` are known before
    :meth:`start`. ``loop`` is uvicorn's choice of event loop (``"asyncio"``,
    ``"uvloop"``, or ``"auto"``: uvloop where installed); ``setup`` and ``teardown`` are
    coroutines run on that loop before serving and after it stopped; ``options`` are
    ``uvicorn.Config``'s (``http``, ``backlog``, ``timeout_graceful_shutdown``, ...).
    A connection whose request headers have not all arrived within ``header_timeout_s``
    seconds is closed (:mod:`~agl_trainer.http.header_timeout`; None: never).
    ``name`` names the thread and the server in errors.
    """

    def __init__(
        self,
        apps: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "agl-http",
        loop: str = "asyncio",
        setup: Callable[[], Awaitable[None]] | None = None,
        teardown: Callable[[], Awaitable[None]] | None = None,
        header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S,
        **options: Any,
    ):
        import uvicorn

        apps = list(apps) if isinstance(apps, list | tuple) else [apps]
        settings = {"log_level": "warning", "lifespan": "off", "access_log": False, "ws": "none", **options}
        settings["http"] = http_protocol(settings.get("http", "auto"), header_timeout_s)
        self.host = host
        self.name = name
        self.sockets: list[socket.socket] = []
        try:
            for k in range(len(apps)):
                self.sockets.append(bind(host, port + k if port else 0))
        except OSError:
            self._close_sockets()
            raise
        self.ports: list[int] = [s.getsockname()[1] for s in self.sockets]
        self.servers = [uvicorn.Server(uvicorn.Config(app, loop=loop, **settings)) for app in apps]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._setup, self._teardown = setup, teardown
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # -- addresses ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The first app's port."""
        return self.ports[0]

    @property
    def urls(self) -> list[str]:
        """``http://host:port`` of each app."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return [f"http://{host}:{port}" for port in self.ports]

    @property
    def url(self) -> str:
        """The first app's ``http://host:port``."""
        return self.urls[0]

    # -- life cycle --------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        """Serve in the background; returns once every app is listening.

        Raises RuntimeError naming why when a server fails first (``setup`` included) or
        ``timeout_s`` passes; the thread is then stopped.
        """
        if self.thread is not None:
            raise RuntimeError(f"{self.name} is already started")
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self.thread.start()
        if not self._ready.wait(timeout_s) or self._failure is not None:
            why = self._failure or f"not listening after {timeout_s} s"
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {why}") from self._failure
        return self

    def _main(self) -> None:
        factory = self.servers[0].config.get_loop_factory()
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                self.loop = runner.get_loop()
                runner.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - start() raises it
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        if self._setup is not None:
            await self._setup()
        try:
            tasks = [
                asyncio.ensure_future(server.serve(sockets=[sock]))
                for server, sock in zip(self.servers, self.sockets, strict=True)
            ]
            while not all(server.started for server in self.servers):
                for task in tasks:
                    if task.done():  # it ended before listening: its error, or why not
                        task.result()
                        raise RuntimeError("uvicorn stopped before it was listening")
                await asyncio.sleep(STARTED_POLL_S)
            self._ready.set()
            await asyncio.gather(*tasks)
        finally:
            if self._teardown is not None:
                await self._teardown()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving (uvicorn's graceful shutdown) and wait up to ``timeout_s`` for the thread."""
        for server in self.servers:
            server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout_s)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in self.sockets:
            sock.close()

    @property
    def running(self) -> bool:
        """Whether the thread is serving (started and not stopped)."""
        return self.thread is not None and self.thread.is_alive()

    # -- the loop from other threads -------------------------------------------------------
    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> Any:
        """Run ``coro`` on the server's loop and return its result (RuntimeError when not serving)."""
        if self.loop is None or not self.running:
            coro.close()
            raise RuntimeError(f"{self.name} is not started")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the server's loop, without waiting."""
        if self.loop is not None and self.running:
            self.loop.call_soon_threadsafe(fn, *args)

    def __enter__(self) -> BackgroundServer:
        return self.start() if self.thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
