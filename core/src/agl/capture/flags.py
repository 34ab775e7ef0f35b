"""The one reading of on/off environment variables, for every integration's zero-line switch.

``AGL_LANGCHAIN_INSTRUMENT``, ``AGL_AUTOGEN_INSTRUMENT`` and
``AGL_OPENAI_AGENTS_INSTRUMENT`` all mean the same values: case and surrounding
spaces aside, ``1``, ``true``, ``yes``, ``on`` switch capture on; ``0``, ``false``,
``no``, ``off`` and the empty string leave it off. Any other value is a mistake
the user should hear about, so :func:`env_flag` raises rather than guess; each
integration reports that once through its error guard and leaves capture off.
"""

from __future__ import annotations

import os

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
"""Values (lower-cased, stripped) that switch a flag on."""

FALSE_VALUES = frozenset({"0", "false", "no", "off", ""})
"""Values (lower-cased, stripped) that leave a flag off."""


def parse_flag(name: str, value: str) -> bool:
    """``value`` of the variable ``name`` as a bool.

    Raises ValueError, naming the variable and the accepted values, for anything
    that is neither in :data:`TRUE_VALUES` nor in :data:`FALSE_VALUES`.
    """
    text = value.strip().lower()
    if text in TRUE_VALUES:
        return True
    if text in FALSE_VALUES:
        return False
    raise ValueError(f"{name}={value!r}: use 1, true, yes or on to switch it on; 0, false, no, off or empty for off")


def env_flag(name: str, default: bool = False) -> bool:
    """Whether the environment variable ``name`` is switched on; ``default`` when it is unset.

    Raises ValueError for a value :func:`parse_flag` does not accept.
    """
    value = os.environ.get(name)
    if value is None:
        return default
    return parse_flag(name, value)
