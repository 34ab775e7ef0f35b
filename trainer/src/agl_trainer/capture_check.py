"""Say when capture was switched on and captured nothing.

A rollout whose LLM calls went through the gateway but whose agent sent no LLM span
still trains (on the gateway's records), only without agent names or span messages,
so capture that silently does nothing looks like success. The usual causes: an
instrumentor that failed to load (``opentelemetry-instrument`` skips it, silently when
a module is missing), tracing switched off, or a misspelled switch. ``agl run`` and the trainer
ask :func:`capture_switched_on` what was on, count the rollouts in
:attr:`~agl_trainer.transitions.BuildReport.rollouts_without_spans`, and say
:func:`silent_capture_warning` once per run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from agl import env
from agl.capture.flags import TRUE_VALUES

SWITCHES: dict[str, str] = {
    env.LANGCHAIN_INSTRUMENT: "agl-langchain",
    env.AUTOGEN_INSTRUMENT: "agl-autogen",
    env.OPENAI_AGENTS_INSTRUMENT: "agl-openai-agents",
}
"""Each integration's zero-line switch, with the integration it switches on."""

OTEL_LAUNCHER = "opentelemetry-instrument"
"""OpenTelemetry's zero-code launcher, which loads agl-otel's instrumentor (its entry point)."""

_IN_PROCESS = {
    "agl_langchain": ("agl-langchain", "active_handler"),
    "agl_autogen": ("agl-autogen", "instrumented"),
    "agl_openai_agents": ("agl-openai-agents", "instrumented"),
    "agl_otel": ("agl-otel", "instrumented"),
}
"""Integrations that can be instrumented in this process: module, name, and the function saying so."""

CAUSES = (
    "an instrumentor that failed to load (opentelemetry-instrument skips one that fails to import, "
    "without a word when a module is missing: often a version clash, such as "
    "opentelemetry-instrumentation-openai-v2 2.4b0 next to opentelemetry-util-genai 1.3b0; "
    "import the instrumentor in the agent's Python to see), tracing switched off (OTEL_SDK_DISABLED, "
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS), a misspelled switch, or LLM calls made through a "
    "client the integration does not see"
)
"""The likely causes, in the order they were met."""


def misspelled_switches(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per unknown ``AGL_*`` variable that is switched on and looks like a capture switch."""
    environ = os.environ if environ is None else environ
    lines = []
    for name, meant in env.unknown(environ).items():
        if environ[name].strip().lower() in TRUE_VALUES and ("INSTRUMENT" in name or meant in SWITCHES):
            lines.append(f"${name} (agl reads no such variable" + (f"; did you mean ${meant}?)" if meant else ")"))
    return lines


def switched_on_by(environ: Mapping[str, str], command: Sequence[str] = ()) -> list[str]:
    """The capture an agent started with ``environ`` and ``command`` has switched on, one phrase
    each: the integrations' switches, ``opentelemetry-instrument`` as the launcher, and switches
    that look misspelled (capture the user meant to switch on)."""
    on = []
    for name, integration in SWITCHES.items():
        if environ.get(name, "").strip().lower() in TRUE_VALUES:
            on.append(f"{integration} (${name})")
    if command and os.path.basename(command[0]) == OTEL_LAUNCHER:
        disabled = environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
        if "agl" not in {d.strip() for d in disabled.split(",")}:
            on.append(f"agl-otel ({OTEL_LAUNCHER})")
    on.extend(misspelled_switches(environ))
    return on


def instrumented_here() -> list[str]:
    """The integrations instrumented in this process (an in-process agent's capture)."""
    on = []
    for module, (integration, check) in _IN_PROCESS.items():
        loaded = sys.modules.get(module)
        if loaded is not None and getattr(loaded, check, lambda: False)():
            on.append(f"{integration} (instrumented in this process)")
    return on


def capture_switched_on(command: Sequence[str] = ()) -> list[str]:
    """What capture is on for agents of this process: :func:`switched_on_by` this process's
    environment, then :func:`instrumented_here`, without repeats."""
    on = switched_on_by(os.environ, command)
    return on + [c for c in instrumented_here() if c.split(" ")[0] not in {o.split(" ")[0] for o in on}]


def silent_capture_warning(capture: Sequence[str], rollouts: int, example: str) -> str:
    """The one line that says capture was on and captured nothing for ``rollouts`` rollouts."""
    return (
        f"capture was on ({', '.join(capture)}) but {rollouts} finished rollout(s) with gateway calls "
        f"had no LLM span joined to any call (e.g. rollout {example}), so their calls train without agent "
        f"names or span messages; likely causes: {CAUSES}"
    )
