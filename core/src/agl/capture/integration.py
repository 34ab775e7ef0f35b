"""What every agl integration offers, and the one zero-line start they share.

The contract. Each integration package (``agl_langchain``, ``agl_autogen``,
``agl_openai_agents``, ``agl_otel``) exports the same three functions, and its
``instrument`` module has the same names again with the tested version range:

``instrument() -> recorder``
    Capture every run of the framework in this process from now on, with no code
    change in the agent. Returns the object that records: agl-langchain's
    :class:`AglCallbackHandler`, agl-otel's :class:`AglSpanProcessor`,
    agl-openai-agents' :class:`AglTracingProcessor`, agl-autogen's
    :class:`~agl.capture.patching.Patches` (its hooks on AutoGen's classes). Idempotent:
    a second call changes nothing and returns the same object. The framework's
    version is checked first (``check_framework_version``): outside ``TESTED`` it warns
    once, or with ``AGL_STRICT_VERSIONS=1`` raises before anything is installed.
``uninstrument() -> None``
    Stop that capture; idempotent. What can be removed is removed (patches, hooks); what
    a framework cannot remove (a trace or span processor) is left in place, idle.
``instrumented() -> bool``
    Whether capture is on: True after :func:`instrument`, False after
    :func:`uninstrument`. (agl-langchain is also on while ``AGL_LANGCHAIN_INSTRUMENT``
    is, since its configure hook reads the variable on every run; agl-otel also
    when ``opentelemetry-instrument`` loaded it.)

and, except agl-otel (whose zero-line switch is OpenTelemetry's own
``opentelemetry-instrument``), an ``ENV_VAR`` (``AGL_<FRAMEWORK>_INSTRUMENT``) and an
``autoload() -> bool`` that the package's one-line ``.pth`` file runs at interpreter
start through :func:`autoload` here.
"""

from __future__ import annotations

import importlib
import logging

from agl import env


def switch_name(package: str) -> str:
    """The name of the integration ``package``'s zero-line switch: ``agl_autogen`` -> ``AGL_AUTOGEN_INSTRUMENT``."""
    return f"AGL_{package.removeprefix('agl_').upper()}_INSTRUMENT"


def switch_of(package: str) -> env.Variable:
    """The :mod:`agl.env` variable :func:`switch_name` names; a ValueError when agl declares none."""
    name = switch_name(package)
    for variable in env.VARIABLES:
        if variable == name:
            return variable
    raise ValueError(f"package: {package!r} has no zero-line switch ({name} is not an agl variable)")


def autoload(package: str) -> bool:
    """Run ``package.instrument.autoload()``: what an integration's ``.pth`` file calls when its switch is on.

    Unknown ``AGL_*`` variables are warned about first (interpreter start is where the
    agent's variables are read). Never raises: a failure is logged on the ``package``
    logger, naming the switch, and the user's program starts without capture. Returns
    whether capture is on.
    """
    logger = logging.getLogger(package)
    try:
        switch_of(package)
        env.warn_unknown()
        return bool(importlib.import_module(f"{package}.instrument").autoload())
    except Exception:  # never stop the user's program from starting
        logger.exception("%s: %s is on but instrumenting failed", package, switch_name(package))
        return False
