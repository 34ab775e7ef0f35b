"""Run at interpreter start by ``agl_autogen.pth`` when ``AGL_AUTOGEN_INSTRUMENT`` is set and not plainly off."""

import logging

try:
    from agl_autogen.instrument import autoload

    autoload()
except Exception:  # never stop the user's program from starting
    logging.getLogger("agl_autogen").exception("agl_autogen: AGL_AUTOGEN_INSTRUMENT is on but instrumenting failed")
