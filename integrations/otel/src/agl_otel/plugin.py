"""agl plugin: mounts the OTLP/HTTP traces endpoint (:mod:`agl_otel._endpoint`) on ``agl store serve``.

The endpoint is imported only when a store server asks for its routes, so an agent
process that loads this plugin never imports a web framework.
"""

from __future__ import annotations

import agl


@agl.hookimpl
def agl_store_routes(store) -> list:
    from agl_otel._endpoint import traces_route

    return [traces_route(store)]
