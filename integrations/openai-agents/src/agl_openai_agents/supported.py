"""The Agents SDK versions agl-openai-agents is tested with, checked before any hook goes in."""

from __future__ import annotations

from agl.capture.versions import check_version

TESTED = "openai-agents>=0.24,<0.25"
"""The Agents SDK versions agl-openai-agents is tested with; the package installs up to ``<1``."""


def check_framework_version() -> bool:
    """Whether the installed SDK is in :data:`TESTED`; outside it warns once (raises with ``AGL_STRICT_VERSIONS=1``).

    Called by :class:`AglTracingProcessor` (and so by :func:`instrument`) before any hook goes in.
    """
    return check_version(
        "agl_openai_agents",
        TESTED,
        still_works="the trace processor on the SDK's public tracing API (model calls from generation and "
        "response spans, tools, agents, handoffs, guardrails)",
        may_break="the two hooks on private SDK methods, OpenAIChatCompletionsModel._fetch_response (the "
        "response id of Chat Completions calls) and OpenAIResponsesModel._fetch_response (the request of a "
        "failed Responses API call), which join those calls to the gateway's token ids",
    )
