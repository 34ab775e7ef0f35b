"""Imported at interpreter start when ``AGL_OPENAI_AGENTS_INSTRUMENT`` is set (see ``agl_openai_agents.pth``)."""

try:
    from agl_openai_agents.instrument import instrument

    instrument()
except Exception as exc:  # never stop the user's program from starting
    from agl_openai_agents._guard import report

    report("AGL_OPENAI_AGENTS_INSTRUMENT", exc)
