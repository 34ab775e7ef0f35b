"""Run at interpreter start by ``agl_openai_agents.pth`` when ``AGL_OPENAI_AGENTS_INSTRUMENT`` is set, not off."""

import logging

from agl.env import OPENAI_AGENTS_INSTRUMENT, warn_unknown  # stdlib only: importable whenever agl is installed

try:
    warn_unknown()
    from agl_openai_agents.instrument import autoload

    autoload()
except Exception:  # never stop the user's program from starting
    logging.getLogger("agl_openai_agents").exception(
        "agl_openai_agents: %s is on but instrumenting failed", OPENAI_AGENTS_INSTRUMENT
    )
