"""Tool-call figures from the gateway's records: how often the model calls the calculator validly.

Each LLM call the gateway recorded with tools in its request is classified by what the
model wrote:

- ``valid``: a parseable call to an existing tool with valid arguments (a JSON object
  whose ``expression`` is a string);
- ``bad_arguments``: a call the engine parsed, to an existing tool, whose arguments are
  not a JSON object with a string ``expression``;
- ``malformed``: the model opened a ``<tool_call>`` block the engine could not parse
  into a call to an existing tool (bad JSON, an unknown tool name), so it came back as
  text;
- ``no_call``: a plain text answer.

The validity rate is ``valid`` over all tool-offering calls. Calls without tools are not
counted (the agent makes none now: its one call is offered the calculator).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

KINDS = ("valid", "bad_arguments", "malformed", "no_call")
ARGUMENT = "expression"


def valid_arguments(arguments: Any) -> bool:
    """Whether a call's ``arguments`` (a JSON string) are an object with a string ``expression``."""
    if not isinstance(arguments, str):
        return False
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get(ARGUMENT), str) and bool(parsed[ARGUMENT].strip())


def classify(request: dict, response: dict) -> str | None:
    """The kind of one recorded call (see the module doc); None when the request offered no tools."""
    if not request.get("tools") or request.get("tool_choice") == "none":
        return None
    choices = response.get("choices") or [{}]
    message = choices[0].get("message") or {}
    calls = message.get("tool_calls") or []
    if calls:
        ok = all(valid_arguments((c.get("function") or {}).get("arguments")) for c in calls)
        return "valid" if ok else "bad_arguments"
    return "malformed" if "<tool_call>" in (message.get("content") or "") else "no_call"


def tool_call_figures(calls: Iterable[Any], episodes: int) -> dict[str, Any]:
    """Counts per kind, the validity rate and tool calls per episode over recorded LLM calls.

    ``calls`` are :class:`agl.LLMCall` records (or anything with ``request`` and
    ``response`` dicts); ``episodes`` is the number of rollouts they came from.
    """
    kinds: Counter[str] = Counter()
    requested = 0
    for call in calls:
        kind = classify(call.request or {}, call.response or {})
        if kind is None:
            continue
        kinds[kind] += 1
        if kind in ("valid", "bad_arguments"):
            message = ((call.response or {}).get("choices") or [{}])[0].get("message") or {}
            requested += len(message.get("tool_calls") or [])
    offered = sum(kinds.values())
    return {
        "tool_offering_calls": offered,
        "tool_call_kinds": {k: kinds.get(k, 0) for k in KINDS},
        "tool_call_validity": kinds["valid"] / offered if offered else None,
        "tool_calls_per_episode": requested / episodes if episodes else None,
    }
