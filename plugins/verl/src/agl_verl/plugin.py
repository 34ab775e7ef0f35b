"""The agl plugin this package registers (entry point ``agl = agl_verl.plugin``).

Heavy modules (torch, verl) are imported only when a component is asked for,
so ``agl plugins`` stays fast.
"""

from __future__ import annotations

import agl

ENGINES = {
    "transformers": "agl_verl.engines.transformers_engine:TransformersEngine",
    "vllm": "agl_verl.engines.vllm_engine:VllmEngine",
}
BACKENDS = {
    "verl": "agl_verl.backend:VerlBackend",
}


def _load(path: str):
    module_name, _, attr = path.partition(":")
    module = __import__(module_name, fromlist=[attr])
    return getattr(module, attr)


@agl.hookimpl
def agl_engine(name: str, config: dict):
    if name in ENGINES:
        return _load(ENGINES[name])(**config)
    return None


@agl.hookimpl
def agl_backend(name: str, config: dict):
    if name in BACKENDS:
        return _load(BACKENDS[name])(**config)
    return None


@agl.hookimpl
def agl_list_components() -> dict[str, list[str]]:
    return {"engines": sorted(ENGINES), "backends": sorted(BACKENDS)}


@agl.hookimpl
def agl_register_commands(subparsers) -> None:
    """``agl engine serve`` and ``agl engine model-path`` (see :mod:`agl_verl.cli`)."""
    from agl_verl.cli import register

    register(subparsers)
