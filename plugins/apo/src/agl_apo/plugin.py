"""The agl plugin this package registers (entry point ``agl = agl_apo.plugin``): the ``apo`` backend."""

from __future__ import annotations

import agl


def _build(**config):
    from agl_apo.backend import ApoBackend

    return ApoBackend(**config)


_build.__qualname__ = "backend apo (agl_apo.backend:ApoBackend)"


@agl.hookimpl
def agl_register_backends(register) -> None:
    register("apo", _build, description="prompt optimization: textual gradients, bootstrapped demos (agl_apo.backend)")
