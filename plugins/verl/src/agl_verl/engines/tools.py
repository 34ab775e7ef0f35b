"""The tool-call convention for models whose chat template has no tool section.

Some small models (SmolLM2-135M-Instruct among them) have a chat template that knows
nothing of tools. For them the engine uses one convention, the Hermes / Qwen2.5 one:

- **Tool definitions** are rendered into the system prompt (appended to the first system
  message, or as a new first system message) as a ``# Tools`` section listing one JSON
  object per tool inside ``<tools></tools>`` and asking for calls in the form below.
- **A call** is written by the model as::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

  Several calls are several blocks. The engine parses them out of the output and returns
  OpenAI ``tool_calls`` (arguments as a JSON string: the model's own text of the object
  where that is valid JSON, else the object re-encoded) with ``finish_reason
  "tool_calls"``; text outside the blocks is the message ``content``. A stream sends a
  call's arguments as they are generated (:mod:`agl_verl.engines.chat_stream`).
- **History**: an assistant message with ``tool_calls`` is rendered as its content
  followed by one block per call; ``tool`` messages become a ``user`` turn holding
  ``<tool_response>...</tool_response>`` (consecutive ones share that turn).
- **tool_choice**: ``"none"`` leaves the tools out of the prompt and parses nothing;
  ``"auto"`` lets the model choose; ``"required"`` forces the response to start with
  ``<tool_call>\\n{"name": "`` and a named function forces
  ``<tool_call>\\n{"name": "NAME", "arguments": `` (constrained decoding by a forced
  prefix; the forced tokens are part of the response ids and carry their logprobs). With
  a single tool, ``"required"`` forces that tool's name too. If the result still does not
  parse, the request is retried a few times (with ``seed`` given, retries use other seeds;
  at temperature 0 a retry repeats the same output).
- **One system prompt per conversation**: the ``# Tools`` section depends on the tools
  alone, never on ``tool_choice``, so every turn of a conversation that offers the same
  tools renders the same system prompt, and a turn's prompt ids begin with the previous
  turn's prompt and response ids (what ``transitions.merge: prefix`` needs to merge the
  calls). The choice is told to the model by the forced prefix alone, at the end of the
  prompt, after the history: ``"required"`` starts the response as a call and a named
  function starts it as a call of that function, which says at least what the former
  sentence in the system prompt said ("You must call at least one function." / "You must
  call the function NAME."), in the place where the model acts on it. A turn with
  ``"none"`` still renders no tools, so it does not share the system prompt of the turns
  that offer them.

Models whose template has a tool section get the tools through the template; their output
is parsed by the same ``<tool_call>`` convention, which is the one such templates (Qwen2.5,
Hermes) ask for. The recorded prompt ids are always the ids of the rendered prompt.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
"""The start of a call as the convention writes it, up to its arguments (the name in group 1)."""


@dataclass
class ToolChoice:
    """``mode`` is none, auto, required or function (then ``name`` is set)."""

    mode: str = "auto"
    name: str | None = None


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    return isinstance(template, str) and "tools" in template


def tools_system_prompt(tools: list[dict]) -> str:
    """The ``# Tools`` section the convention appends to the system prompt: the same for the same tools
    on every turn, whatever the turn's ``tool_choice`` (:func:`forced_prefix` carries that)."""
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    text = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    return text


def forced_prefix(choice: ToolChoice, tool: dict | None = None) -> str:
    """Text the response is forced to start with for ``choice`` ("" when free).

    Given the named function's definition (``tool``), the start of its arguments is
    forced too: the whole call for a function without parameters, else ``{"KEY": `` for
    its first required parameter (and the opening quote when that one is a string).
    Small models otherwise tend to copy the schema itself as the arguments.
    """
    if choice.mode == "required":
        return TOOL_CALL_OPEN + '\n{"name": "'
    if choice.mode == "function":
        return (
            TOOL_CALL_OPEN + "\n" + json.dumps({"name": choice.name})[:-1] + ', "arguments": ' + _arguments_start(tool)
        )
    return ""


def _arguments_start(tool: dict | None) -> str:
    params = ((tool or {}).get("function") or {}).get("parameters")
    if not isinstance(params, dict):
        return ""
    properties = params.get("properties")
    if properties == {}:
        return "{}}\n" + TOOL_CALL_CLOSE
    required = params.get("required")
    if not isinstance(properties, dict) or not isinstance(required, list) or not required:
        return ""
    key = required[0]
    if not isinstance(key, str) or not isinstance(properties.get(key), dict):
        return ""
    start = "{" + json.dumps(key, ensure_ascii=False) + ": "
    return start + '"' if properties[key].get("type") == "string" else start


def format_call(name: str, arguments: Any) -> str:
    """One call as the convention writes it."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def render_messages(messages: list[dict], tools: list[dict] | None, choice: ToolChoice) -> list[dict]:
    """Rewrite OpenAI messages (already text-only) into plain role/content turns by the convention."""
    out: list[dict] = []
    for message in messages:
        role = message["role"]
        content = message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            blocks = [
                format_call(c["function"]["name"], c["function"].get("arguments", {})) for c in message["tool_calls"]
            ]
            content = "\n".join(([content] if content else []) + blocks)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("_tool_turn", None)
    if tools and choice.mode != "none":
        section = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = (out[0]["content"] + "\n\n" + section) if out[0]["content"] else section
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def parse_tool_calls(text: str, *, allowed: set[str] | None = None) -> tuple[str | None, list[dict]]:
    """Split model output into (content, OpenAI tool_calls).

    Returns no calls when there is no block, or when any block is not a JSON object with a
    string ``name`` (and, given ``allowed``, a known one): a half-valid set of calls is
    not returned as if it were whole. Up to two missing closing braces at the end of a
    block are restored. An unterminated last block (the model stopped right
    after the JSON) counts; one cut short inside its arguments keeps their complete
    leading members.
    """
    if TOOL_CALL_OPEN not in text:
        return (text or None), []
    calls = []
    for body in _BLOCK.findall(text):
        obj = _load_call(body)
        if obj is None:
            return (text or None), []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return (text or None), []
        if allowed is not None and obj["name"] not in allowed:
            return (text or None), []
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(arguments, str):
            raw = _raw_arguments(body, closed=True)
            arguments = (
                raw if raw is not None and _loads(raw) == arguments else json.dumps(arguments, ensure_ascii=False)
            )
        calls.append(
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": obj["name"], "arguments": arguments},
            }
        )
    content = _BLOCK.sub("", text).strip()
    return (content or None), calls


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _raw_arguments(body: str, *, closed: bool) -> str | None:
    """The arguments of one call's JSON text ``body`` as the model wrote them: what follows
    ``"arguments":``, less the call object's closing brace once the call is ``closed``, and,
    while it is not, less a tail that may still be part of the end (whitespace, closing braces,
    the start of ``</tool_call>``), so that what is returned only ever grows. None before the
    arguments begin."""
    head = _HEAD.match(body)
    if head is None:
        return None
    args = body[head.end() :]
    if closed:
        args = args.rstrip()
        return args[:-1].rstrip() if args.endswith("}") else args
    for n in range(len(TOOL_CALL_CLOSE) - 1, 0, -1):
        if args.endswith(TOOL_CALL_CLOSE[:n]):
            args = args[:-n]
            break
    return args.rstrip().rstrip("}").rstrip()


def streamable_calls(text: str) -> list[tuple[str, str]]:
    """``(name, arguments so far)`` of each tool call in an output still being generated, in order, as far
    as they can be streamed: up to the first call whose arguments have not begun. The arguments of a
    finished call are the raw text :func:`parse_tool_calls` returns for it when that text is its JSON
    object (the usual case), so a stream of them adds up to what the parse gives at the end."""
    out: list[tuple[str, str]] = []
    start = text.find(TOOL_CALL_OPEN)
    while start >= 0:
        begin = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, begin)
        body = text[begin:end].strip() if end >= 0 else text[begin:].lstrip()
        head = _HEAD.match(body)
        args = _raw_arguments(body, closed=end >= 0)
        if head is None or args is None:
            break
        out.append((head.group(1), args))
        if end < 0:
            break
        start = text.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
    return out


def _load_call(body: str) -> Any:
    """The JSON object of one block; small models often drop the final brace(s), which are restored.

    A complete call followed by stray text (a small model that wrote the call, then
    rambled on without ``</tool_call>``) is that call. A block cut short inside its
    arguments (``max_tokens`` reached) keeps the arguments' complete leading members:
    it is cut at the last comma that leaves a valid call with an ``arguments`` object.
    """
    for suffix in ("", "}", "}}"):
        try:
            return json.loads(body + suffix)
        except ValueError:
            continue
    try:
        obj = json.JSONDecoder().raw_decode(body)[0]
        if isinstance(obj, dict) and "name" in obj:
            return obj
    except ValueError:
        pass
    for cut in reversed([m.start() for m in re.finditer(",", body)]):
        for suffix in ("}}", "}"):
            try:
                obj = json.loads(body[:cut] + suffix)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("arguments"), dict) and obj["arguments"]:
                return obj
    return None
