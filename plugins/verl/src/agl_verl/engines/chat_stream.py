"""The deltas of one streamed chat choice, as its text grows token by token.

Without tools the text streams as it comes (less a tail that may begin a stop string).
With tools offered (:mod:`agl_verl.engines.tools`' ``<tool_call>`` convention) text streams
while it can be no part of a call; a call streams as OpenAI's ``tool_calls`` deltas once its
name is written (``id``, ``name``), then its arguments as they are generated, so that a
client sees them grow (Anthropic's ``input_json_delta``, through the gateway). At the end
the whole output is parsed as a plain answer is (:func:`agl_verl.engines.tools.parse_tool_calls`):
what was streamed is a prefix of what the parse gives, and the last delta carries the rest.

Where the parse disagrees with what was streamed (a call cut short by ``max_tokens``, or a
later block that is no valid call, so the answer parses as text), the streamed call stays
as sent: the choice then ends with its own ``finish_reason`` (``length``, ``stop``), and
the text of the calls is not sent again as content.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from agl_verl.engines.tools import TOOL_CALL_OPEN, streamable_calls

log = logging.getLogger(__name__)


class ChatDeltas:
    """What one choice's stream has sent, and the delta each new token adds."""

    def __init__(self, *, tools_active: bool, allowed: set[str], parallel: bool) -> None:
        self.tools_active = tools_active
        self.allowed = allowed
        self.parallel = parallel
        self.sent = ""  # content sent
        self.call_ids: list[str] = []
        self.call_args: list[str] = []  # each streamed call's arguments sent

    def step(self, text: str) -> dict[str, Any]:
        """The delta for the output so far (``text``: safe to stream, no partial character or stop string)."""
        delta: dict[str, Any] = {}
        visible = _before_tool_call(text) if self.tools_active else text
        if len(visible) > len(self.sent) and visible.startswith(self.sent):
            delta["content"] = visible[len(self.sent) :]
            self.sent = visible
        if self.tools_active:
            calls = self._call_deltas(text)
            if calls:
                delta["tool_calls"] = calls
        return delta

    def _call_deltas(self, text: str) -> list[dict]:
        out = []
        for k, (name, args) in enumerate(streamable_calls(text)):
            if name not in self.allowed or (k > 0 and not self.parallel):
                break
            if k == len(self.call_ids):
                self.call_ids.append("call_" + uuid.uuid4().hex[:24])
                self.call_args.append("")
                fn = {"name": name, "arguments": ""}
                out.append({"index": k, "id": self.call_ids[k], "type": "function", "function": fn})
            sent = self.call_args[k]
            if len(args) > len(sent) and args.startswith(sent):
                out.append({"index": k, "function": {"arguments": args[len(sent) :]}})
                self.call_args[k] = args
        return out

    def last(self, message: dict, calls: list[dict], text: str, finish: str) -> tuple[dict[str, Any], str]:
        """The last delta and the ``finish_reason``: ``message`` and ``calls`` are the whole output's
        parse (as a plain answer's), ``text`` its text, ``finish`` the row's own finish reason."""
        delta: dict[str, Any] = {}
        if calls:
            content = message["content"] or ""
            rests = [d for k, call in enumerate(calls) if (d := self._rest_of_call(k, call))]
            if rests:
                delta["tool_calls"] = rests
            finish = "tool_calls"
        elif self.call_ids:  # calls streamed that the whole output does not parse as: they end as they are
            content = text.split(TOOL_CALL_OPEN, 1)[0].rstrip()
            rests = self._call_deltas(text)
            if rests:
                delta["tool_calls"] = rests
        else:
            content = text
        rest = _after(content, self.sent)
        if rest:
            delta["content"] = rest
        return delta, finish

    def _rest_of_call(self, k: int, call: dict) -> dict | None:
        """What is left to send of call ``k`` of the parse (its id becomes the streamed one)."""
        if k >= len(self.call_ids):
            return {"index": k, **call}
        call["id"] = self.call_ids[k]
        args, sent = call["function"]["arguments"], self.call_args[k]
        if not args.startswith(sent):
            log.warning("engine: a streamed tool call's arguments differ from the parsed ones: %.200s", args)
            return None
        return {"index": k, "function": {"arguments": args[len(sent) :]}} if len(args) > len(sent) else None


def _before_tool_call(text: str) -> str:
    """The part of ``text`` that can be no part of a tool call: the text before ``<tool_call>``, less a
    tail that may begin one and less trailing whitespace (the content of an answer with calls is stripped)."""
    cut = text.find(TOOL_CALL_OPEN)
    if cut >= 0:
        return text[:cut].rstrip()
    for n in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:n]):
            text = text[:-n]
            break
    return text.rstrip()


def _after(content: str, sent: str) -> str:
    """What is left of ``content`` to stream once ``sent`` was (the parsed content of an answer with tool
    calls is stripped, so streamed leading whitespace is not in it)."""
    if content.startswith(sent):
        return content[len(sent) :]
    core = sent.lstrip()
    return content[len(core) :] if content.startswith(core) else content
