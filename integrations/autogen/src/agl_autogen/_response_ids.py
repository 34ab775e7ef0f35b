"""Response ids of AutoGen model calls, read off AutoGen's event logger.

:class:`~autogen_core.models.CreateResult` carries no response id, so a logging
filter on AutoGen's event logger (``autogen_core.events``) reads the
``LLMCallEvent`` that real model clients (OpenAI, Azure OpenAI) emit with the
full response dump and hands it to the model call in flight in the same task
(:data:`agl_autogen._record.pending_call`). Calls without one (the replay client,
streamed calls) carry no ``gen_ai.response.id``; the trainer then joins them with
the gateway's records by their order in the rollout.
"""

from __future__ import annotations

import logging

from agl.capture import error_guard
from agl_autogen._record import pending_call

_guard = error_guard("agl_autogen")


class EventTap(logging.Filter):
    """A filter on ``autogen_core.events`` that reads response ids off ``LLMCallEvent``.

    AutoGen logs these events at INFO. If the user's logging configuration would not
    have passed INFO records of that logger, the tap lowers the logger's level to
    INFO to see them and then drops every record below the user's level again, so
    nothing new reaches the user's handlers.
    """

    def __init__(self, drop_below: int):
        super().__init__("agl_autogen")
        self.drop_below = drop_below

    def filter(self, record: logging.LogRecord) -> bool:
        call = pending_call.get()
        if call is not None:
            try:
                kwargs = getattr(record.msg, "kwargs", None)
                if isinstance(kwargs, dict) and kwargs.get("type") == "LLMCall":
                    response = kwargs.get("response")
                    if isinstance(response, dict):
                        call.response = response
            except Exception as exc:
                _guard.report("event logger tap", exc)
        return record.levelno >= self.drop_below


_tap: EventTap | None = None


def install_tap() -> None:
    """Add the :class:`EventTap` to AutoGen's event logger (once)."""
    global _tap
    if _tap is not None:
        return
    from autogen_core import EVENT_LOGGER_NAME

    logger = logging.getLogger(EVENT_LOGGER_NAME)
    effective = logger.getEffectiveLevel()
    drop_below = effective if effective > logging.INFO else logging.NOTSET
    if effective > logging.INFO:
        logger.setLevel(logging.INFO)
    _tap = EventTap(drop_below)
    logger.addFilter(_tap)


def remove_tap() -> None:
    """Undo :func:`install_tap`."""
    global _tap
    if _tap is None:
        return
    from autogen_core import EVENT_LOGGER_NAME

    logger = logging.getLogger(EVENT_LOGGER_NAME)
    logger.removeFilter(_tap)
    if _tap.drop_below > logging.INFO and logger.level == logging.INFO:
        logger.setLevel(logging.NOTSET)
    _tap = None
