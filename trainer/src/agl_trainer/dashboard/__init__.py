"""A web dashboard over a store: runs (reward curves and step metrics), rollouts, one rollout's spans and calls.

Served under ``/ui`` by ``agl store serve`` and by ``agl dashboard --store URL``. Pages
are HTML rendered on the server (inline CSS and SVG charts, no JavaScript build, nothing
fetched from elsewhere) and need the store's admin token (see :mod:`agl_trainer.dashboard.app`).
"""

from __future__ import annotations

from typing import Any

from agl.store.base import Store
from agl_trainer.dashboard.app import MAX_BODY_BYTES, dashboard_app, reward_from_form

__all__ = ["PREFIX", "dashboard_app", "reward_from_form", "with_dashboard"]

PREFIX = "/ui"


class _Dispatch:
    """ASGI: requests under the dashboard's prefix go to the dashboard, the rest to ``app``;
    ``routes`` lists both's (starlette routes)."""

    def __init__(self, app: Any, dashboard: Any, prefix: str):
        self.app = app
        self.dashboard = dashboard
        self.prefix = prefix
        self.close = getattr(app, "close", lambda: None)
        self.routes = [*getattr(app, "routes", []), *dashboard.routes]

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == self.prefix or path.startswith(self.prefix + "/")):
            await self.dashboard(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def with_dashboard(
    app: Any, store: Store, *, token: str, prefix: str = PREFIX, max_body_bytes: int = MAX_BODY_BYTES
) -> Any:
    """``app`` with the dashboard served under ``prefix`` (it checks the token itself, bearer or
    login cookie, and refuses a body past ``max_body_bytes``). It reads any store through the
    :class:`~agl.store.base.Store` interface."""
    dashboard = dashboard_app(store, token=token, prefix=prefix, max_body_bytes=max_body_bytes)
    return _Dispatch(app, dashboard, prefix)
