"""Run at interpreter start by ``agl_autogen.pth`` when ``AGL_AUTOGEN_INSTRUMENT`` is set and not plainly off."""

import logging

from agl.env import AUTOGEN_INSTRUMENT, warn_unknown  # stdlib only: importable whenever agl is installed

try:
    warn_unknown()
    from agl_autogen.instrument import autoload

    autoload()
except Exception:  # never stop the user's program from starting
    logging.getLogger("agl_autogen").exception("agl_autogen: %s is on but instrumenting failed", AUTOGEN_INSTRUMENT)
