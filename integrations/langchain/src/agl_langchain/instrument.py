"""Zero-line capture: every LangChain run gets an :class:`AglCallbackHandler`.

LangChain builds the callback manager of every run in
``langchain_core.callbacks.manager._configure``, which consults the hooks
registered with ``langchain_core.tracers.context.register_configure_hook``:
for each hook whose variable's ``.get()`` returns a handler, that handler is
added to the run (once: a run that already has an ``AglCallbackHandler``,
passed explicitly, is left alone, so nothing is captured twice).

agl registers one hook when this module is imported. Its variable is a small
switch object rather than a ``ContextVar``, so that the handler it returns is
seen from every thread (a ``ContextVar`` set in one thread is not seen by a
bare ``threading.Thread``) and so that :func:`uninstrument` can turn it off
again (LangChain offers no way to remove a hook). The switch returns a handler
when :func:`instrument` has been called, or when ``AGL_LANGCHAIN_INSTRUMENT``
is switched on (read with :func:`agl.capture.env_flag` on each run, so it can be
flipped at run time). ``AGL_LANGCHAIN_INSTRUMENT=1`` works without importing
anything: the ``agl_langchain.pth`` file installed with the package runs
:func:`agl.capture.integration.autoload`, which imports this module (registering the
hook) and runs :func:`autoload`. The contract :func:`instrument`, :func:`uninstrument`
and :func:`instrumented` share with the other integrations is
:mod:`agl.capture.integration`'s.
"""

from __future__ import annotations

import os
import threading

from langchain_core.tracers.context import register_configure_hook

from agl.capture import error_guard
from agl.capture.versions import check_version
from agl.env import LANGCHAIN_INSTRUMENT
from agl_langchain.handler import AglCallbackHandler

ENV_VAR = LANGCHAIN_INSTRUMENT
"""Switch on (``1``, ``true``, ``yes``, ``on``; see :func:`agl.capture.env_flag`) to capture every run."""

TESTED = "langchain-core>=1.0,<2"
"""The langchain-core versions agl-langchain supports: public API only, so up to the next major."""

_guard = error_guard("agl_langchain")


def check_framework_version() -> bool:
    """Whether langchain-core is in :data:`TESTED`; outside it warns once (raises if ``AGL_STRICT_VERSIONS=1``).

    Called by :func:`instrument` and, when ``AGL_LANGCHAIN_INSTRUMENT`` is on, by :func:`autoload`.
    """
    return check_version(
        "agl_langchain",
        TESTED,
        still_works="whatever of LangChain's public callback API the new major kept (agl-langchain uses no "
        "private LangChain API)",
        may_break="AglCallbackHandler's callbacks (on_chat_model_start, on_llm_end, on_tool_*, on_chain_*, "
        "on_custom_event) and the zero-line configure hook (register_configure_hook)",
    )


def env_enabled() -> bool:
    """Whether ``AGL_LANGCHAIN_INSTRUMENT`` is on; a value :func:`agl.capture.env_flag` refuses is reported, off."""
    return _guard.env_flag(ENV_VAR)


class _HandlerSwitch:
    """Quacks like the ``ContextVar`` LangChain expects in a configure hook."""

    def __init__(self) -> None:
        self.handler: AglCallbackHandler | None = None
        self._env_handler: AglCallbackHandler | None = None
        self._lock = threading.Lock()

    def get(self) -> AglCallbackHandler | None:
        handler = self.handler
        if handler is not None:
            return handler
        if ENV_VAR in os.environ and env_enabled():
            return self._from_env()
        return None

    def _from_env(self) -> AglCallbackHandler:
        with self._lock:
            if self._env_handler is None:
                self._env_handler = AglCallbackHandler()
            return self._env_handler


_switch = _HandlerSwitch()
_registered = False
_register_lock = threading.Lock()


def _register() -> None:
    global _registered
    with _register_lock:
        if not _registered:
            # inheritable: child runs get the handler through their parent's manager.
            register_configure_hook(_switch, True, AglCallbackHandler)  # type: ignore[arg-type]
            _registered = True


def instrument(handler: AglCallbackHandler | None = None) -> AglCallbackHandler:
    """Capture every LangChain and LangGraph run in this process, with no callbacks passed.

    Returns the handler in use (``handler``, or a new one), whose ``errors``
    counter can be inspected. Calling it again replaces the handler.
    """
    check_framework_version()
    _register()
    _switch.handler = handler or _switch.handler or AglCallbackHandler()
    return _switch.handler


def uninstrument() -> None:
    """Stop the capture :func:`instrument` started (``AGL_LANGCHAIN_INSTRUMENT`` still applies if on)."""
    _switch.handler = None


def instrumented() -> bool:
    """Whether capture is on: :func:`instrument` is in effect, or ``AGL_LANGCHAIN_INSTRUMENT`` is on."""
    return _switch.get() is not None


def autoload() -> bool:
    """The zero-line hook the ``.pth`` file runs at interpreter start; whether capture is on.

    Importing this module registered the configure hook, which reads
    ``AGL_LANGCHAIN_INSTRUMENT`` on every run; this only reads it once more so that
    a value it refuses is reported at start rather than at the first run.
    """
    enabled = env_enabled()
    if enabled:
        check_framework_version()
    return enabled


def active_handler() -> AglCallbackHandler | None:
    """The handler zero-line capture adds to runs now, or None when it is off."""
    return _switch.get()


_register()
