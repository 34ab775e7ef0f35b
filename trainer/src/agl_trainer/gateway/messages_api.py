"""Anthropic's Messages API (``/v1/messages``), served on the engine's chat interface.

A Messages request (checked by :class:`agl_trainer.anthropic_requests.MessagesRequest`)
becomes a chat request:

- ``system`` → a system message (text blocks joined by newlines);
- a user message's ``text`` and ``image`` blocks → a user message, each ``tool_result``
  → a ``tool`` message answering its ``tool_use_id`` (``is_error`` results are prefixed
  ``Error: ``), in the order the blocks come;
- an assistant message's ``text`` → its content, its ``tool_use`` blocks → ``tool_calls``
  (``input`` as JSON text);
- custom ``tools`` → function tools (``input_schema`` as ``parameters``); ``tool_choice``
  ``auto``/``any``/``tool``/``none`` → ``auto``/``required``/the named function/``none``,
  ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``;
- ``stop_sequences`` → ``stop``, ``metadata.user_id`` → ``user``,
  ``output_config.format`` → ``response_format``; ``max_tokens``, ``temperature``,
  ``top_p``, ``top_k`` (vLLM's extension) and ``stream`` as they are;
- a last assistant message (a prefill) → ``continue_final_message: true,
  add_generation_prompt: false`` (vLLM's and agl's engines): the prompt ends with the
  prefill's text, open, and the answer continues it (an empty one is left out; one with
  ``tool_use`` blocks is refused).

So tools reach the model through the engine's tool convention exactly as chat tools do,
and the recorded prompt ids are those of the prompt the engine rendered. The engine's
chat answer becomes a Message (``msg_...``, the gateway's response id): text → a
``text`` block, tool calls → ``tool_use`` blocks (ids ``toolu_...``: the engine's
``call_x`` is ``toolu_x``), ``finish_reason`` → ``stop_reason``
(``length`` → ``max_tokens``, also when the rollout's ``max_response_tokens`` cut it;
then a tool call cut short is left out of the text rather than shown as ``<tool_call>``
markup; tool calls → ``tool_use``; a stop string the engine names in vLLM's
``stop_reason`` → ``stop_sequence``; else ``end_turn``). A streamed answer becomes
Anthropic's event sequence as it arrives (where tools were offered, text that may begin
a tool call is held until it is known not to): ``message_start``, ``ping``, then per block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``)
/ ``content_block_stop``, then ``message_delta`` and ``message_stop``; an engine that
drops the stream ends it with an ``error`` event. Calls are recorded exactly as chat
completions are, with endpoint ``messages``.

``/v1/messages/count_tokens`` asks the engine to render the same chat request (one
token sampled, nothing recorded; routed to the policy its ``model`` names, 404 when none
does) and answers ``{"input_tokens": len(prompt_token_ids)}``.

Errors on these routes are in Anthropic's shape (:func:`error_body`); a refused
``thread`` carries ``error.details.error_code: "thread_unsupported_request"``, on which the
SDK's tool runner resends the conversation unthreaded.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from agl_trainer import anthropic_requests
from agl_trainer.gateway import translated, validate
from agl_trainer.gateway.errors import GatewayError, invalid
from agl_trainer.gateway.recorder import CallMeta
from agl_trainer.http import named_event

log = logging.getLogger(__name__)

TOOL_CALL_MARKUP = "<tool_call>"
"""Where a tool call begins in the text of an answer by the engines' tool convention (``agl_verl.engines.tools``)."""
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(err: GatewayError) -> dict:
    """``err`` in Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``.

    The message names the field at fault; the error type follows the status as Anthropic's
    API and SDK pair them (other 4xx: ``invalid_request_error``, 5xx: ``api_error``).
    """
    kind = _ERROR_TYPES.get(err.status) or ("api_error" if err.status >= 500 else "invalid_request_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": err.message}}
    if err.code == anthropic_requests.THREAD_UNSUPPORTED:  # what the SDK's thread fallback reads
        body["error"]["details"] = {"error_code": err.code, "unsupported": ["thread"]}
    request_id = err.headers.get("X-Request-Id")
    if request_id:
        body["request_id"] = request_id
    return body


def in_anthropic_terms(err: GatewayError) -> GatewayError:
    """An engine's refusal of the translated chat request, told in the Messages API's terms.

    The engine names the chat request's parts: an image is an ``image_url`` part there,
    and its message index counts the system and tool messages the translation made.
    """
    if err.status == 400 and "image_url" in err.message:
        return GatewayError(
            400,
            "messages: image blocks are not supported by the engine serving this policy (it reads text only); "
            "send text blocks",
            param="messages",
            code="unsupported_feature",
        )
    return err


# -- requests -----------------------------------------------------------------------------


def _text(blocks: list[dict]) -> str:
    return "\n".join(b["text"] for b in blocks if b["type"] == "text")


def _user_content(blocks: list[dict]) -> str | list[dict]:
    """Chat content for a run of text and image blocks: a string when all are text."""
    if all(b["type"] == "text" for b in blocks):
        return _text(blocks)
    parts = []
    for b in blocks:
        if b["type"] == "text":
            parts.append({"type": "text", "text": b["text"]})
        else:
            source = b["source"]
            url = source["url"] if source["type"] == "url" else f"data:{source['media_type']};base64,{source['data']}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _tool_message(block: dict) -> dict:
    content = block.get("content")
    if isinstance(content, list):
        content = _user_content(content)
    content = content or ""
    if block.get("is_error"):
        content = "Error: " + content if isinstance(content, str) else [{"type": "text", "text": "Error:"}, *content]
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _user_messages(blocks: list[dict]) -> list[dict]:
    out: list[dict] = []
    run: list[dict] = []  # text and image blocks since the last tool_result
    for block in blocks:
        if block["type"] == "tool_result":
            if run:
                out.append({"role": "user", "content": _user_content(run)})
                run = []
            out.append(_tool_message(block))
        else:
            run.append(block)
    if run or not out:
        out.append({"role": "user", "content": _user_content(run)})
    return out


def _assistant_message(blocks: list[dict]) -> dict:
    calls = [
        {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": _text(blocks) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _chat_messages(parsed: anthropic_requests.CountTokensRequest) -> list[dict]:
    messages: list[dict] = []
    if parsed.system is not None:
        system = parsed.system if isinstance(parsed.system, str) else _text(parsed.system)
        messages.append({"role": "system", "content": system})
    for message in parsed.messages:
        if message.role == "user":
            messages += _user_messages(message.blocks())
        else:
            messages.append(_assistant_message(message.blocks()))
    if messages[-1]["role"] == "assistant" and not messages[-1]["content"] and "tool_calls" not in messages[-1]:
        messages.pop()  # an empty prefill: nothing to continue, the answer starts afresh
    return messages


def _prefill(parsed: anthropic_requests.CountTokensRequest, messages: list[dict]) -> dict:
    """The chat fields that continue a last assistant message (a prefill) rather than close it."""
    if messages[-1]["role"] != "assistant":
        return {}
    if "tool_calls" in messages[-1]:
        at = len(parsed.messages) - 1
        raise invalid(
            f"messages[{at}].content",
            "a last assistant message is a prefill the answer continues: it may hold text only, no tool_use "
            "(answer the tool_use with a tool_result in a user message)",
        )
    return {"continue_final_message": True, "add_generation_prompt": False}


def _tools(parsed: anthropic_requests.CountTokensRequest) -> dict:
    """The chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``."""
    out: dict[str, Any] = {}
    if parsed.tools:
        out["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "parameters": t.input_schema}
                | ({"description": t.description} if t.description is not None else {}),
            }
            for t in parsed.tools
        ]
    choice = parsed.tool_choice
    if choice is not None:
        named = {"type": "function", "function": {"name": choice.name}}
        out["tool_choice"] = named if choice.type == "tool" else _CHOICES[choice.type]
        if choice.disable_parallel_tool_use and parsed.tools:
            out["parallel_tool_calls"] = False
    return out


def _conversation(parsed: anthropic_requests.CountTokensRequest) -> dict:
    messages = _chat_messages(parsed)
    body: dict[str, Any] = {"model": parsed.model, "messages": messages, **_tools(parsed), **_prefill(parsed, messages)}
    fmt = parsed.output_config.format if parsed.output_config is not None else None
    if fmt is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
    return body


def to_chat_request(req: dict) -> dict:
    """The chat completion request a Messages request stands for; 400 naming the field if it cannot."""
    parsed = validate.check_messages(req)
    body = _conversation(parsed)
    body["max_tokens"] = parsed.max_tokens
    for key in ("temperature", "top_p", "top_k", "stream"):
        if getattr(parsed, key) is not None:
            body[key] = getattr(parsed, key)
    if parsed.stop_sequences:
        body["stop"] = parsed.stop_sequences
    if parsed.metadata is not None and parsed.metadata.user_id is not None:
        body["user"] = parsed.metadata.user_id
    validate.check_chat(body)
    return body


def count_chat_request(req: dict) -> dict:
    """The chat request whose prompt ids a count_tokens request asks the length of (one token sampled)."""
    body = _conversation(validate.check_count_tokens(req))
    body["max_tokens"] = 1
    validate.check_chat(body)
    return body


# -- answers ------------------------------------------------------------------------------


def _stop(finish_reason: str | None, matched: Any, stops: list[str], used_tools: bool) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat choice's ``finish_reason`` (and vLLM's ``stop_reason``)."""
    if finish_reason == "length":
        return "max_tokens", None
    if used_tools:  # a call whose arguments were no object is text, and the turn ends
        return "tool_use", None
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def tool_use_id(call_id: str | None) -> str:
    """The ``toolu_`` id of a chat tool call (``call_abc`` → ``toolu_abc``; a fresh one where the engine gave none)."""
    if not call_id:
        return f"toolu_{uuid.uuid4().hex[:24]}"
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def _arguments(raw: str) -> dict | None:
    """A tool call's arguments as the object ``tool_use.input`` holds; None if they are not a JSON object."""
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def _tool_use(call: dict) -> dict:
    """A ``tool_use`` block for a chat tool call; a call whose arguments are not a JSON object stays text."""
    fn = call.get("function") or {}
    args = _arguments(fn.get("arguments") or "")
    if args is None:
        log.info(
            "gateway: a tool call's arguments are not a JSON object; answered as text: %.200s", fn.get("arguments")
        )
        return {"type": "text", "text": json.dumps({"name": fn.get("name", ""), "arguments": fn.get("arguments")})}
    return {"type": "tool_use", "id": tool_use_id(call.get("id")), "name": fn.get("name", ""), "input": args}


def _without_cut_call(text: str, finish_reason: str | None, req: dict) -> str:
    """The text of an answer that ``max_tokens`` cut inside a tool call, without the call's unfinished markup
    (the engine's ``<tool_call>`` convention): the answer stops with ``max_tokens``, as Claude's does; the
    recorded ids keep every token."""
    at = text.find(TOOL_CALL_MARKUP) if finish_reason == "length" and req.get("tools") else -1
    if at < 0:
        return text
    log.info("gateway: a tool call cut by max_tokens is left out of the answer: %.200s", text[at:])
    return text[:at].rstrip()


def _usage(usage: dict | None) -> dict:
    usage = usage or {}
    return {"input_tokens": usage.get("prompt_tokens") or 0, "output_tokens": usage.get("completion_tokens") or 0}


def _shell(msg_id: str, model: str | None, req: dict) -> dict:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model or req.get("model"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def from_chat_response(chat: dict, req: dict, msg_id: str, model: str | None) -> dict:
    """The Message a chat completion stands for."""
    message = _shell(msg_id, model, req)
    choice = (chat.get("choices") or [{}])[0]
    said = choice.get("message") or {}
    text = _without_cut_call(said.get("content") or "", choice.get("finish_reason"), req)
    if text:
        message["content"].append({"type": "text", "text": text})
    message["content"] += [_tool_use(call) for call in said.get("tool_calls") or []]
    used_tools = any(b["type"] == "tool_use" for b in message["content"])
    stops = req.get("stop_sequences") or []
    message["stop_reason"], message["stop_sequence"] = _stop(
        choice.get("finish_reason"), choice.get("stop_reason"), stops, used_tools
    )
    message["usage"] = _usage(chat.get("usage"))
    return message


class EventStream:
    """Turns chat stream chunks into Anthropic's stream events, as they arrive."""

    def __init__(self, req: dict, msg_id: str, model: str | None):
        self.message = _shell(msg_id, model, req)
        self.req = req
        self.held = ""  # text that may be tool-call markup, not streamed yet
        self.stops = req.get("stop_sequences") or []
        self.started = False
        self.block: dict | None = None  # the open content block
        self.calls: dict[int, dict] = {}  # chat tool-call index → its tool_use block
        self.arguments: dict[int, list[str]] = {}
        self.finish_reason: str | None = None
        self.matched: Any = None

    @staticmethod
    def _event(name: str, **fields: Any) -> bytes:
        return named_event(name, {"type": name, **fields})

    def start(self) -> list[bytes]:
        return []  # message_start waits for the first chunk: it carries the prompt's ids, its input_tokens

    def failed(self, message: str) -> bytes:
        return self._event("error", error={"type": "api_error", "message": message})

    @property
    def result(self) -> dict:
        return self.message

    def _start(self, chunk: dict) -> list[bytes]:
        self.started = True
        prompt = chunk.get("prompt_token_ids")
        self.message["usage"]["input_tokens"] = len(prompt) if prompt is not None else 0
        return [self._event("message_start", message=dict(self.message, content=[])), self._event("ping")]

    def _open(self, block: dict) -> list[bytes]:
        out = self._close()
        self.message["content"].append(block)
        self.block = block
        start = dict(block, input={}) if block["type"] == "tool_use" else dict(block, text="")
        return out + [self._event("content_block_start", index=len(self.message["content"]) - 1, content_block=start)]

    def _close(self) -> list[bytes]:
        if self.block is None:
            return []
        index = self.message["content"].index(self.block)
        self.block = None
        return [self._event("content_block_stop", index=index)]

    def _text(self, text: str) -> list[bytes]:
        out = (
            [] if self.block is not None and self.block["type"] == "text" else self._open({"type": "text", "text": ""})
        )
        self.block["text"] += text
        index = len(self.message["content"]) - 1
        return out + [self._event("content_block_delta", index=index, delta={"type": "text_delta", "text": text})]

    def _offer(self, text: str) -> list[bytes]:
        """Stream ``text``, but where tools were offered hold back what may be tool-call markup (from
        ``<tool_call>`` on, or a tail that may begin it) until the answer ends (:meth:`_release`)."""
        if not self.req.get("tools"):
            return self._text(text)
        self.held += text
        at = self.held.find(TOOL_CALL_MARKUP)
        if at < 0:
            at = next(
                (
                    len(self.held) - n
                    for n in range(len(TOOL_CALL_MARKUP) - 1, 0, -1)
                    if self.held.endswith(TOOL_CALL_MARKUP[:n])
                ),
                len(self.held),
            )
        ready, self.held = self.held[:at], self.held[at:]
        return self._text(ready) if ready else []

    def _release(self) -> list[bytes]:
        """The held-back text, once the answer has ended or a tool call has come as such."""
        held, self.held = _without_cut_call(self.held, self.finish_reason, self.req), ""
        return self._text(held) if held else []

    def _tool(self, tc: dict) -> list[bytes]:
        k, fn = tc.get("index", 0), tc.get("function") or {}
        out: list[bytes] = []
        block = self.calls.get(k)
        if block is None:
            call_id = tool_use_id(tc.get("id"))
            block = self.calls[k] = {"type": "tool_use", "id": call_id, "name": fn.get("name") or "", "input": {}}
            self.arguments[k] = []
            out += self._open(block)
        if fn.get("arguments"):
            self.arguments[k].append(fn["arguments"])
            index = self.message["content"].index(block)
            delta = {"type": "input_json_delta", "partial_json": fn["arguments"]}
            out.append(self._event("content_block_delta", index=index, delta=delta))
        return out

    def feed(self, chunk: dict) -> list[bytes]:
        out = [] if self.started else self._start(chunk)
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._offer(delta["content"])
            if delta.get("tool_calls"):
                out += self._release()
            for tc in delta.get("tool_calls") or []:
                out += self._tool(tc)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
                out += self._release()
        return out

    def finish(self, usage: dict | None) -> list[bytes]:
        out = ([] if self.started else self._start({})) + self._release() + self._close()
        for k, block in self.calls.items():  # the record keeps arguments that are no JSON object as their text
            text = "".join(self.arguments[k])
            block["input"] = _arguments(text) if _arguments(text) is not None else text
        stop_reason, stop_sequence = _stop(self.finish_reason, self.matched, self.stops, bool(self.calls))
        self.message.update(stop_reason=stop_reason, stop_sequence=stop_sequence, usage=_usage(usage))
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out.append(self._event("message_delta", delta=delta, usage=dict(self.message["usage"])))  # cumulative
        out.append(self._event("message_stop"))
        return out


class Messages(translated.TranslatedDialect):
    """The Messages API's :class:`~agl_trainer.gateway.dialect.Dialect`: errors in Anthropic's shape,
    engine refusals in its terms."""

    endpoint = "messages"
    id_prefix = "msg_"

    @staticmethod
    def engine_request(req: dict) -> dict:
        return to_chat_request(req)

    @staticmethod
    def translators(meta: CallMeta, req: dict, model: str | None) -> translated.Translators:
        return translated.Translators(
            lambda chat: from_chat_response(chat, req, meta.call_id, model),
            lambda: EventStream(req, meta.call_id, model),
        )

    @staticmethod
    def engine_error(err: GatewayError) -> GatewayError:
        return in_anthropic_terms(err)

    @staticmethod
    def error_body(err: GatewayError) -> bytes:
        return json.dumps(error_body(err)).encode()


DIALECT = Messages()
"""``/v1/messages`` (and the shape of ``/v1/messages/count_tokens``'s errors)."""
