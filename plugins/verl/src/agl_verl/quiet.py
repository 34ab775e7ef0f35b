"""Keep transformers' per-call progress bars out of a training run's console."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


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
