"""``AGL_LANGCHAIN_INSTRUMENT=1`` with no import: run at interpreter start by ``agl_langchain.pth``.

The wheel installs a one-line ``agl_langchain.pth`` into site-packages. Python runs
it at every start; it only looks at ``AGL_LANGCHAIN_INSTRUMENT`` and, unless it is
unset or plainly off, imports this module. Importing it imports ``agl_langchain``
(and so ``langchain_core``), which registers the configure hook that adds an
:class:`~agl_langchain.AglCallbackHandler` to every run while the variable is on;
:func:`agl_langchain.instrument.autoload` then checks the value once
(:func:`agl.capture.env_flag`) so that a mistyped one is reported at start.

``python -S``, or a ``site`` module that skips .pth files, turns this off; then
``import agl_langchain`` (still no handler to pass) does the same.
"""

import logging

from agl.env import LANGCHAIN_INSTRUMENT, warn_unknown  # stdlib only: importable whenever agl is installed

try:
    warn_unknown()
    from agl_langchain.instrument import autoload

    autoload()
except Exception:  # never stop the user's program from starting
    logging.getLogger("agl_langchain").exception("agl_langchain: %s is on but loading failed", LANGCHAIN_INSTRUMENT)
