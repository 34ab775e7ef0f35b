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


TORCH_INSTALL = (
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (CPU), "
    "or the CUDA build for your GPU from https://pytorch.org/get-started/locally/"
)
"""How to install what agl-verl needs but does not pull in itself (the CPU build would be the wrong one on a GPU)."""


def _load(path: str):
    """The class at ``module:attr``; a missing torch is a ConfigError saying how to install it."""
    from agl.errors import ConfigError

    module_name, _, attr = path.partition(":")
    try:
        module = __import__(module_name, fromlist=[attr])
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "torch":
            raise ConfigError(f"agl-verl needs torch: {TORCH_INSTALL}") from exc
        raise
    return getattr(module, attr)


def _factory(kind: str, name: str, path: str):
    """A factory for the component at ``path``: its ``model_path`` is checked first, so that a wrong folder is
    named before anything heavy loads."""

    def build(**config):
        from agl_verl.models import check_model_dir

        if config.get("model_path") is not None:
            check_model_dir(config["model_path"], f"{kind} {name}: model_path")
        return _load(path)(**config)

    build.__qualname__ = f"{kind} {name} ({path})"
    return build


@agl.hookimpl
def agl_register_engines(register) -> None:
    for name, path in ENGINES.items():
        register(name, _factory("engine", name, path), description=path)


@agl.hookimpl
def agl_register_backends(register) -> None:
    for name, path in BACKENDS.items():
        register(name, _factory("backend", name, path), description=path)


@agl.hookimpl
def agl_register_commands(register) -> None:
    """``agl engine serve`` and ``agl engine model-path`` (see :mod:`agl_verl.cli`)."""
    from agl_verl.cli import configure

    register("engine", configure, description="serve a model with token ids and logprobs (agl-verl)")
