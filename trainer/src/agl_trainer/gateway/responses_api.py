"""The Responses API (``/v1/responses``), served on the engine's chat interface.

A Responses request becomes a chat request (instructions → a system message;
``function_call`` and ``function_call_output`` items → assistant tool calls and tool
messages; function tools and ``tool_choice`` → their chat forms; ``text.format`` →
``response_format``), the engine's chat answer becomes a Response, and a streamed
chat answer becomes the Responses event stream as it arrives. Token ids are
recorded exactly as for chat completions, with endpoint ``responses``.

The request is checked by :class:`agl_trainer.openai_requests.ResponsesRequest`. The
gateway keeps no conversation state: ``previous_response_id``, ``conversation``
and stored prompts are refused with a 400 (send the whole input, as the OpenAI
Agents SDK does by default).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from agl_trainer.gateway import translated, validate
from agl_trainer.gateway.recorder import CallMeta
from agl_trainer.http import named_event
from agl_trainer.openai_requests import ResponsesRequest

_PASSED = ("temperature", "top_p", "parallel_tool_calls", "stream", "seed", "stop", "user")


def _text_of(content: str | list) -> str | list:
    """Chat content for a Responses message content (a string, or parts; checked by the model)."""
    if isinstance(content, str):
        return content
    texts, parts = [], []
    for part in content:
        kind = part["type"]
        if kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            continue
        text = (part.get("refusal") if kind == "refusal" else part.get("text")) or ""
        texts.append(text)
        parts.append({"type": "text", "text": text})
    return "\n".join(texts) if len(texts) == len(parts) else parts


def _messages(req: ResponsesRequest) -> list[dict]:
    messages: list[dict] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
        return messages
    prev_assistant = False
    for item in req.input:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text_of(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if prev_assistant:  # calls right after an assistant turn belong to it
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text_of(item["output"])})
        prev_assistant = kind == "function_call" or (kind == "message" and item.get("role") == "assistant")
    return messages


def _tools(req: dict) -> list[dict]:
    out = []
    for tool in req.get("tools") or []:
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    spec.setdefault("name", "output")
    return {"type": "json_schema", "json_schema": spec}


def to_chat_request(req: dict) -> dict:
    """The chat completion request a Responses request stands for; 400 naming the field if it cannot."""
    parsed = validate.check_responses(req)
    body: dict[str, Any] = {"messages": _messages(parsed)}
    if parsed.model is not None:
        body["model"] = parsed.model
    for key in _PASSED:
        if req.get(key) is not None:
            body[key] = req[key]
    tools = _tools(req)
    if tools:
        body["tools"] = tools
    choice = _tool_choice(parsed.tool_choice)
    if choice is not None:
        body["tool_choice"] = choice
    if parsed.max_output_tokens is not None:  # checked as the client named it, not as max_tokens
        body["max_tokens"] = parsed.max_output_tokens
    fmt = _response_format(parsed.text)
    if fmt is not None:
        body["response_format"] = fmt
    if not tools:
        body.pop("parallel_tool_calls", None)
    validate.check_chat(body)
    return body


# -- answers ------------------------------------------------------------------------------


def _usage(usage: dict | None) -> dict | None:
    if not usage:
        return None
    inp, out = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


def _shell(req: dict, resp_id: str, model: str | None, created: float) -> dict:
    """A Response object with everything but its output, status and usage."""
    text = req.get("text") if isinstance(req.get("text"), dict) else {"format": {"type": "text"}}
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "model": model or req.get("model") or "agl-policy",
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "metadata": req.get("metadata") or {},
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": req.get("temperature"),
        "text": text,
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p"),
        "truncation": req.get("truncation") or "disabled",
    }


def length_reason(output_tokens: int | None, client_limit: int | None, cap: int | None) -> str:
    """Why a response stopped at a length limit, named after the limit that ended it.

    ``max_output_tokens`` (OpenAI's reason) only when the client's own limit did; the
    rollout's cap (``rollout_max_response_tokens``) and a full context
    (``context_length``) are limits the client never set.
    """
    if output_tokens is not None:
        if client_limit is not None and output_tokens >= client_limit and (cap is None or client_limit <= cap):
            return "max_output_tokens"
        if cap is not None and output_tokens >= cap:
            return "rollout_max_response_tokens"
        return "context_length"
    if client_limit is not None and (cap is None or client_limit <= cap):
        return "max_output_tokens"
    return "rollout_max_response_tokens" if cap is not None else "context_length"


def _finish(resp: dict, finish_reason: str | None, usage: dict | None, cap: int | None) -> dict:
    if finish_reason == "length":
        resp["status"] = "incomplete"
        out = (usage or {}).get("completion_tokens")
        resp["incomplete_details"] = {"reason": length_reason(out, resp.get("max_output_tokens"), cap)}
    else:
        resp["status"] = "completed"
    resp["usage"] = _usage(usage)
    return resp


def _message_item(text: str, item_id: str, status: str = "completed") -> dict:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _call_item(call: dict, item_id: str, status: str = "completed") -> dict:
    fn = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
        "name": fn.get("name", ""),
        "arguments": fn.get("arguments", ""),
        "status": status,
    }


def from_chat_response(chat: dict, req: dict, resp_id: str, model: str | None, cap: int | None = None) -> dict:
    """The Response a chat completion stands for (``cap``: the rollout's response cap, if any)."""
    resp = _shell(req, resp_id, model, chat.get("created") or time.time())
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if message.get("content"):
        resp["output"].append(_message_item(message["content"], f"msg_{uuid.uuid4().hex}"))
    for call in message.get("tool_calls") or []:
        resp["output"].append(_call_item(call, f"fc_{uuid.uuid4().hex}"))
    return _finish(resp, choice.get("finish_reason"), chat.get("usage"), cap)


class EventStream:
    """Turns chat stream chunks into Responses stream events, as they arrive."""

    def __init__(self, req: dict, resp_id: str, model: str | None, cap: int | None = None):
        self.resp = _shell(req, resp_id, model, time.time())
        self.cap = cap
        self.seq = 0
        self.text_item: dict | None = None
        self.text: list[str] = []
        self.calls: dict[int, dict] = {}  # chat tool-call index → output item
        self.open_calls: list[int] = []
        self.finish_reason: str | None = None

    def _event(self, event_type: str, /, **fields: Any) -> bytes:
        payload = {"type": event_type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return named_event(event_type, payload)

    def start(self) -> list[bytes]:
        return [
            self._event("response.created", response=dict(self.resp)),
            self._event("response.in_progress", response=dict(self.resp)),
        ]

    def _close_text(self) -> list[bytes]:
        if self.text_item is None:
            return []
        item, idx = self.text_item, self.resp["output"].index(self.text_item)
        text = "".join(self.text)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item.update(_message_item(text, item["id"]))
        self.text_item = None
        return [
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=idx,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._event("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part),
            self._event("response.output_item.done", output_index=idx, item=item),
        ]

    def _close_calls(self) -> list[bytes]:
        out = []
        for k in self.open_calls:
            item = self.calls[k]
            idx = self.resp["output"].index(item)
            item["status"] = "completed"
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=idx,
                    arguments=item["arguments"],
                    name=item["name"],
                )
            )
            out.append(self._event("response.output_item.done", output_index=idx, item=dict(item)))
        self.open_calls = []
        return out

    def feed(self, chunk: dict) -> list[bytes]:
        out: list[bytes] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.text_item is None:
                    out += self._close_calls()
                    self.text_item = _message_item("", f"msg_{uuid.uuid4().hex}", "in_progress")
                    self.text_item["content"] = []
                    self.resp["output"].append(self.text_item)
                    idx = len(self.resp["output"]) - 1
                    out.append(self._event("response.output_item.added", output_index=idx, item=dict(self.text_item)))
                    out.append(
                        self._event(
                            "response.content_part.added",
                            item_id=self.text_item["id"],
                            output_index=idx,
                            content_index=0,
                            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                        )
                    )
                self.text.append(delta["content"])
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.text_item["id"],
                        output_index=self.resp["output"].index(self.text_item),
                        content_index=0,
                        delta=delta["content"],
                        logprobs=[],
                    )
                )
            for tc in delta.get("tool_calls") or []:
                k = tc.get("index", 0)
                fn = tc.get("function") or {}
                item = self.calls.get(k)
                if item is None:
                    out += self._close_text()
                    item = _call_item(
                        {"id": tc.get("id"), "function": {"name": fn.get("name") or "", "arguments": ""}},
                        f"fc_{uuid.uuid4().hex}",
                        "in_progress",
                    )
                    self.calls[k] = item
                    self.open_calls.append(k)
                    self.resp["output"].append(item)
                    out.append(
                        self._event(
                            "response.output_item.added", output_index=len(self.resp["output"]) - 1, item=dict(item)
                        )
                    )
                elif fn.get("name"):
                    item["name"] += fn["name"]
                if fn.get("arguments"):
                    item["arguments"] += fn["arguments"]
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=item["id"],
                            output_index=self.resp["output"].index(item),
                            delta=fn["arguments"],
                        )
                    )
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return out

    def finish(self, usage: dict | None) -> list[bytes]:
        out = self._close_text() + self._close_calls()
        _finish(self.resp, self.finish_reason, usage, self.cap)
        name = "response.incomplete" if self.resp["status"] == "incomplete" else "response.completed"
        out.append(self._event(name, response=self.resp))
        return out

    def failed(self, message: str) -> bytes:
        self.resp["status"] = "failed"
        self.resp["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", response=self.resp)

    @property
    def result(self) -> dict:
        return self.resp


class Responses(translated.TranslatedDialect):
    """The Responses API's :class:`~agl_trainer.gateway.dialect.Dialect`."""

    endpoint = "responses"
    id_prefix = "resp_"

    @staticmethod
    def engine_request(req: dict) -> dict:
        return to_chat_request(req)

    @staticmethod
    def translators(meta: CallMeta, req: dict, model: str | None) -> translated.Translators:
        return translated.Translators(
            lambda chat: from_chat_response(chat, req, meta.call_id, model, meta.max_response_tokens),
            lambda: EventStream(req, meta.call_id, model, meta.max_response_tokens),
        )


DIALECT = Responses()
"""``/v1/responses``."""
