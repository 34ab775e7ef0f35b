"""The zero-line integration: patch AutoGen so every model client is captured.

:func:`instrument` installs two things, both undone by :func:`uninstrument`:

- the structure hooks of :mod:`agl_autogen.structure` (also installed by
  :class:`~agl_autogen.AglChatCompletionClient`): agents, teams and tools as spans, and
  the response ids AutoGen's event logger carries;
- client hooks: ``create`` and ``create_stream`` of every ``ChatCompletionClient``
  class, those defined now and those defined later, record each call.

Both go through :class:`agl.capture.patching.Patches`. Setting ``AGL_AUTOGEN_INSTRUMENT=1``
calls :func:`instrument` at interpreter start: the ``agl_autogen.pth`` file installed with
the package runs :func:`agl.capture.integration.autoload`, which runs :func:`autoload`.
The contract these functions share with the other integrations is
:mod:`agl.capture.integration`'s.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from agl.capture import error_guard
from agl.capture.patching import Patches, is_wrapped
from agl.env import AUTOGEN_INSTRUMENT
from agl_autogen import _record
from agl_autogen.client import AglChatCompletionClient, capture_stream
from agl_autogen.structure import TESTED, check_framework_version, install_structure_hooks, remove_structure_hooks

__all__ = [
    "ENV_VAR",
    "TESTED",
    "autoload",
    "check_framework_version",
    "install_structure_hooks",
    "instrument",
    "instrumented",
    "uninstrument",
]

ENV_VAR = AUTOGEN_INSTRUMENT
"""Switch on (``1``, ``true``, ``yes``, ``on``; see :func:`agl.capture.env_flag`) to instrument at start."""

_guard = error_guard("agl_autogen")
_lock = threading.Lock()
_patches = Patches()
_clients = False


def _wrap_create(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def create(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        opened = _record.begin_call(self, messages, kwargs.get("tools") or [], stream=False)
        try:
            result = await original(self, messages, *args, **kwargs)
        except BaseException as exc:
            _record.end_call(opened, None, exc)
            raise
        _record.end_call(opened, result, None)
        return result

    return create


def _wrap_create_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_stream(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return capture_stream(self, original(self, messages, *args, **kwargs), messages, kwargs.get("tools") or [])

    return create_stream


def _patch_client_class(cls: type) -> None:
    if issubclass(cls, AglChatCompletionClient):
        return
    for attr, wrap in (("create", _wrap_create), ("create_stream", _wrap_create_stream)):
        method = vars(cls).get(attr)
        if method is None or getattr(method, "__isabstractmethod__", False) or is_wrapped(method):
            continue
        _patches.wrap(cls, attr, wrap)


def _all_subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def instrument() -> Patches:
    """Capture every AutoGen model client, agent, team and tool from now on (idempotent).

    Returns the client hooks (the same object on every call).
    """
    global _clients
    install_structure_hooks()
    with _lock:
        if _clients:
            return _patches
        from autogen_core.models import ChatCompletionClient

        for cls in list(_all_subclasses(ChatCompletionClient)):
            _patch_client_class(cls)

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            super(ChatCompletionClient, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            try:
                with _lock:
                    _patch_client_class(cls)
            except Exception as exc:
                _guard.report("patch a new model client class", exc)

        _patches.replace(ChatCompletionClient, "__init_subclass__", classmethod(__init_subclass__))
        _clients = True
        return _patches


def uninstrument() -> None:
    """Undo :func:`instrument` and the structure hooks."""
    global _clients
    with _lock:
        _patches.undo()
        _clients = False
    remove_structure_hooks()


def instrumented() -> bool:
    """Whether every model client is being captured."""
    return _clients


def autoload() -> bool:
    """The zero-line hook ``agl_autogen.pth`` runs at start: :func:`instrument` if ``AGL_AUTOGEN_INSTRUMENT`` is on.

    Returns whether it instrumented. A value :func:`agl.capture.env_flag` refuses is
    reported (a warning on the ``agl_autogen`` logger) and leaves capture off.
    """
    return _guard.instrument_if_on(ENV_VAR, instrument)
