"""Keep third-party noise out of a training run's console, and out of the user's process.

- :func:`import_verl_quietly` imports verl without its import-time noise: accelerator
  detection warnings, one "engine is not available" UserWarning per optional engine
  (torchtitan, megatron, …), and the root logging handler verl installs. Only agl's own
  import of verl is quieted; verl's warnings at run time, and the user's logging setup,
  are left as they were.
- :func:`no_progress_bars` hides transformers' per-call progress bars.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

_IMPORTED = False


def import_verl_quietly() -> None:
    """Import verl (and its engine registry, which warns) with its import-time noise silenced."""
    global _IMPORTED
    if _IMPORTED:
        return
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"verl\.")
            warnings.filterwarnings("ignore", message=r".* engine is not available")
            import verl  # noqa: F401
            import verl.workers.engine  # noqa: F401
    finally:
        logging.disable(logging.NOTSET)
        root.handlers[:] = handlers  # verl calls logging.basicConfig at import: the user's setup stays theirs
        root.setLevel(level)
    _IMPORTED = True


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Hide transformers' progress bars inside the block, then restore the user's setting.

    Saving and loading weights every step would otherwise print two bars per step.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
