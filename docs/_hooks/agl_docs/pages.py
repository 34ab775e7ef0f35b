"""The reference pages made from the code, by their path under ``docs/``."""

from __future__ import annotations

from collections.abc import Callable

from agl_docs import cli_ref, config_ref, env_ref, hooks_ref

GENERATED: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_ref.agl_page,
    "reference/config.md": config_ref.trainer_page,
    "reference/hooks.md": hooks_ref.agl_page,
    "reference/environment.md": env_ref.agl_page,
}
"""Each generated page's path (relative to ``docs/``) and the function that writes its Markdown."""
