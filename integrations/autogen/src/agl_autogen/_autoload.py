"""Imported at interpreter start when ``AGL_AUTOGEN_INSTRUMENT`` is set (see ``agl_autogen.pth``)."""

try:
    from agl_autogen.instrument import instrument

    instrument()
except Exception as exc:  # never stop the user's program from starting
    from agl_autogen._guard import report

    report("AGL_AUTOGEN_INSTRUMENT", exc)
