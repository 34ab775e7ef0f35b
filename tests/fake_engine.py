"""A fake inference engine: a test double for a model, speaking vLLM's token-id dialect.

It is an OpenAI-compatible HTTP server (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``) that answers deterministically and fast, so the gateway can be tested
and benchmarked without a model. Anything that tests a *real* model's ids (chat
template exactness, logprob agreement) must use a real engine URL instead; every
test here takes the engine as a URL, so swapping is a one-line change.

Its "model" works on bytes: a token id is a byte of UTF-8.

- The prompt of a chat request is the rendering below, and its ids are its bytes::

      <tools>[...]</s>  (when tools are given)  <system>…</s><user>…</s><assistant>…</s><tool id>…</s> … <assistant>

  (with ``continue_final_message`` the last message, an assistant's, stays open: ``…<assistant>prefill``).

- The answer is ``echo: <last user text>`` (or ``result: <tool output>`` after a tool
  message), followed by ``</s>``. A tool is called when ``tool_choice`` is ``required``
  or names one, or when the last user message says ``call <tool name>``; the call is
  rendered as ``<tool_call>{"name": …, "arguments": …}</tool_call>``, so the next
  turn's prompt extends this one's prompt + response exactly.
- Each response token's logprob is ``-0.1 - (id % 10) / 100``.
- ``max_tokens`` cuts the answer (finish ``length``), ``stop`` cuts it at a stop string
  (named in the choice's ``stop_reason``, as vLLM does),
  ``n`` gives choices suffixed `` [i]``, and a prompt plus ``max_tokens`` over
  ``max_model_len`` is refused with vLLM's 400 message.
- ``response_format`` json_schema is honoured (a JSON object) only with ``structured_output=True``.

Run one for benchmarks: ``python -m tests.fake_engine --port 8100``.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import threading
import time
from collections import deque
from typing import Any

MODEL = "fake-policy"
END = "</s>"
_STREAM_PIECE = 4  # tokens per stream chunk


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def render_tool_call(call: dict) -> str:
    fn = call["function"]
    return "<tool_call>" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]}) + "</tool_call>"


def render_message(m: dict) -> str:
    role = m["role"]
    if role == "assistant":
        body = _text(m.get("content")) + "".join(render_tool_call(c) for c in m.get("tool_calls") or [])
        return f"<assistant>{body}{END}"
    if role == "tool":
        return f"<tool {m.get('tool_call_id', '')}>{_text(m.get('content'))}{END}"
    return f"<{role}>{_text(m.get('content'))}{END}"


def render_chat(messages: list[dict], tools: list[dict] | None = None, continue_final: bool = False) -> str:
    """The prompt text the fake "model" sees; its ids are its UTF-8 bytes. With ``continue_final``
    (vLLM's ``continue_final_message``) the last message, an assistant's, is left open to continue."""
    head = ""
    if tools:
        head = "<tools>" + json.dumps([t.get("function") for t in tools], sort_keys=True) + END
    if continue_final:
        return head + "".join(render_message(m) for m in messages)[: -len(END)]
    return head + "".join(render_message(m) for m in messages) + "<assistant>"


def logprob(token: int) -> float:
    return -0.1 - (token % 10) / 100


def _args_for(tool: dict, text: str) -> str:
    props = ((tool.get("function") or {}).get("parameters") or {}).get("properties") or {}
    values = {}
    for name, spec in props.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        values[name] = {"integer": 1, "number": 1, "boolean": True}.get(kind, text) if kind != "string" else text
    return json.dumps(values)


class FakeEngine:
    """The fake engine server. ``start()`` serves it in a background thread; ``url`` ends in ``/v1``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int = 8192,
        structured_output: bool = False,
        delay_s: float = 0.0,
        chunk_delay_s: float = 0.0,
        api_key: str | None = None,
        model: str = MODEL,
    ):
        self.host = host
        self.port = port
        self.max_model_len = max_model_len
        self.structured_output = structured_output
        self.delay_s = delay_s
        self.chunk_delay_s = chunk_delay_s
        self.api_key = api_key
        self.model = model
        self.extra_models: list[str] = []
        """More names /v1/models lists after ``model`` (adapters or versions an engine also serves)."""
        self.requests: deque[dict] = deque(maxlen=1000)
        self.clients: deque[tuple | None] = deque(maxlen=1000)
        """The client's (host, port) of each request: which connection it came on."""
        self.fail_next: deque[int] = deque()
        """Statuses to answer the next requests with (for example 503), one each."""
        self.break_stream_after: int | None = None
        """Drop the connection after this many chunks of the next stream (a crash mid-answer)."""
        self.hold: threading.Event | None = None
        """While this is an unset event, requests wait for it (up to 30 s) before they are answered."""
        self.model_version: str | None = None
        """The ``model_version`` every answer and chunk names, as agl's engines do (None: none, as vLLM)."""
        self.in_flight = 0
        self.max_seen_in_flight = 0
        self.aborted = 0
        """Requests whose client (the gateway) closed the connection before the answer was complete."""
        self.aborted_at: list[float] = []
        """``time.monotonic()`` of each abort."""
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- the model --------------------------------------------------------------------------
    def _answer(self, req: dict, index: int, n: int) -> tuple[str, list[dict] | None]:
        """(text body, tool calls) for one choice, before truncation."""
        messages = req["messages"]
        tools = req.get("tools") or []
        choice = req.get("tool_choice", "auto")
        last = messages[-1]
        text = _text(last.get("content"))
        tool = None
        if tools and choice != "none":
            if isinstance(choice, dict):
                name = (choice.get("function") or {}).get("name")
                tool = next((t for t in tools if t["function"]["name"] == name), None)
            elif choice == "required":
                tool = tools[0]
            elif last["role"] == "user":
                tool = next((t for t in tools if f"call {t['function']['name']}" in text), None)
        if tool is not None:
            call = {
                "id": f"call_{index}_{len(messages)}",
                "type": "function",
                "function": {"name": tool["function"]["name"], "arguments": _args_for(tool, text)},
            }
            return "", [call]
        reply = f"result: {text}" if last["role"] == "tool" else f"echo: {text}"
        fmt = req.get("response_format") or {}
        if fmt.get("type") in ("json_schema", "json_object"):
            reply = json.dumps({"echo": text})
        if n > 1:
            reply += f" [{index}]"
        return reply, None

    def _choice_tokens(self, req: dict, body: str, calls: list[dict] | None, budget: int):
        """(text, tool calls, ids, finish_reason, the stop string that ended it or None) of one choice."""
        full = body + "".join(render_tool_call(c) for c in calls or []) + END
        ids = list(full.encode())
        stop = req.get("stop")
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if not calls:
            for s in stops:
                cut = body.find(s)
                if cut >= 0:
                    body = body[:cut]
                    ids = list(body.encode())
                    return body, None, ids, "stop", s
        if len(ids) > budget:
            ids = ids[:budget]
            return bytes(ids).decode("utf-8", "ignore"), None, ids, "length", None
        return body, calls, ids, "tool_calls" if calls else "stop", None

    def _check(self, req: dict, prompt_len: int) -> tuple[int, dict] | None:
        fmt = req.get("response_format") or {}
        if fmt.get("type") == "json_schema" and not self.structured_output:
            return 400, self._error(
                "response_format json_schema is not supported by this engine (no guided decoding backend)"
            )
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens")
        if prompt_len + (max_tokens or 0) > self.max_model_len or prompt_len >= self.max_model_len:
            return 400, self._error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + (max_tokens or 0)} tokens ({prompt_len} in the messages, {max_tokens or 0} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        return None

    @staticmethod
    def _error(message: str, status: int = 400) -> dict:
        return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}

    def _budget(self, req: dict, prompt_len: int) -> int:
        return req.get("max_tokens") or req.get("max_completion_tokens") or min(4096, self.max_model_len - prompt_len)

    @staticmethod
    def _lp_content(ids: list[int]) -> list[dict]:
        return [
            {"token": chr(t) if t < 128 else f"<{t}>", "logprob": logprob(t), "bytes": [t], "top_logprobs": []}
            for t in ids
        ]

    def chat(self, req: dict) -> tuple[int, dict]:
        prompt = list(render_chat(req["messages"], req.get("tools"), bool(req.get("continue_final_message"))).encode())
        refused = self._check(req, len(prompt))
        if refused:
            return refused
        n = req.get("n") or 1
        choices, completion = [], 0
        for i in range(n):
            body, calls, ids, finish, matched = self._choice_tokens(
                req, *self._answer(req, i, n), self._budget(req, len(prompt))
            )
            completion += len(ids)
            message: dict[str, Any] = {"role": "assistant", "content": body or None}
            if calls:
                message["tool_calls"] = calls
            choice = {
                "index": i,
                "message": message,
                "finish_reason": finish,
                "stop_reason": matched,
                "logprobs": {"content": self._lp_content(ids)} if req.get("logprobs") else None,
            }
            if req.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        out = {
            "id": f"chatcmpl-fake{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
        }
        if req.get("return_token_ids"):
            out["prompt_token_ids"] = prompt
        return 200, out

    def completion(self, req: dict) -> tuple[int, dict]:
        prompt = req["prompt"]
        prompt_ids = list(prompt.encode()) if isinstance(prompt, str) else list(prompt)
        refused = self._check(req, len(prompt_ids))
        if refused:
            return refused
        n = req.get("n") or 1
        choices, completion = [], 0
        for i in range(n):
            body = f"echo {len(prompt_ids)}" + (f" [{i}]" if n > 1 else "")
            body, _, ids, finish, _ = self._choice_tokens(req, body, None, self._budget(req, len(prompt_ids)))
            completion += len(ids)
            choice = {"index": i, "text": body, "finish_reason": finish, "logprobs": None}
            if req.get("logprobs") is not None:
                choice["logprobs"] = {
                    "token_logprobs": [logprob(t) for t in ids],
                    "tokens": [chr(t) for t in ids],
                    "text_offset": list(range(len(ids))),
                    "top_logprobs": None,
                }
            if req.get("return_token_ids"):
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = prompt_ids
            choices.append(choice)
        return 200, {
            "id": f"cmpl-fake{time.monotonic_ns()}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(prompt_ids) + completion,
            },
        }

    def chat_chunks(self, req: dict, full: dict) -> list[dict]:
        """The stream a chat answer ``full`` (asked with token ids and logprobs) is sent as."""
        base = {"id": full["id"], "object": "chat.completion.chunk", "created": full["created"], "model": self.model}
        ids_wanted, lp_wanted = req.get("return_token_ids"), req.get("logprobs")
        chunks = []
        first = dict(
            base,
            choices=[
                {
                    "index": c["index"],
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for c in full["choices"]
            ],
        )
        if ids_wanted:
            first["prompt_token_ids"] = full["prompt_token_ids"]
        chunks.append(first)
        for c in full["choices"]:
            ids = list((c["message"]["content"] or "").encode())
            all_ids = c.get("token_ids") or []
            decoder = codecs.getincrementaldecoder("utf-8")()
            for k in range(0, len(ids), _STREAM_PIECE):
                piece = ids[k : k + _STREAM_PIECE]
                choice = {
                    "index": c["index"],
                    "delta": {"content": decoder.decode(bytes(piece))},
                    "logprobs": {"content": self._lp_content(piece)} if lp_wanted else None,
                    "finish_reason": None,
                }
                if ids_wanted:
                    choice["token_ids"] = piece
                chunks.append(dict(base, choices=[choice]))
            rest = all_ids[len(ids) :]
            for j, call in enumerate(c["message"].get("tool_calls") or []):
                markup = list(render_tool_call(call).encode())
                head = {
                    "index": c["index"],
                    "finish_reason": None,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": j,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    },
                    "logprobs": {"content": self._lp_content(markup)} if lp_wanted else None,
                }
                if ids_wanted:
                    head["token_ids"] = markup
                chunks.append(dict(base, choices=[head]))
                args = call["function"]["arguments"]
                for k in range(0, len(args), 8):
                    chunks.append(
                        dict(
                            base,
                            choices=[
                                {
                                    "index": c["index"],
                                    "finish_reason": None,
                                    "logprobs": None,
                                    "delta": {"tool_calls": [{"index": j, "function": {"arguments": args[k : k + 8]}}]},
                                    **({"token_ids": []} if ids_wanted else {}),
                                }
                            ],
                        )
                    )
                rest = rest[len(markup) :]
            last = {
                "index": c["index"],
                "delta": {},
                "finish_reason": c["finish_reason"],
                "stop_reason": c["stop_reason"],
                "logprobs": {"content": self._lp_content(rest)} if lp_wanted else None,
            }
            if ids_wanted:
                last["token_ids"] = rest
            chunks.append(dict(base, choices=[last]))
        if (req.get("stream_options") or {}).get("include_usage"):
            chunks.append(dict(base, choices=[], usage=full["usage"]))
        return chunks

    def completion_chunks(self, req: dict, full: dict) -> list[dict]:
        base = {"id": full["id"], "object": "text_completion", "created": full["created"], "model": self.model}
        chunks = []
        for c in full["choices"]:
            ids = c.get("token_ids") or list(c["text"].encode())
            visible = c["text"].encode()
            for k in range(0, max(len(ids), 1), _STREAM_PIECE):
                piece = ids[k : k + _STREAM_PIECE]
                done = k + _STREAM_PIECE >= len(ids)
                choice = {
                    "index": c["index"],
                    "text": visible[k : k + _STREAM_PIECE].decode("utf-8", "ignore"),
                    "finish_reason": c["finish_reason"] if done else None,
                    "logprobs": {"token_logprobs": [logprob(t) for t in piece]} if c.get("logprobs") else None,
                }
                if req.get("return_token_ids"):
                    choice["token_ids"] = piece
                    if k == 0:
                        choice["prompt_token_ids"] = c["prompt_token_ids"]
                chunks.append(dict(base, choices=[choice]))
        if (req.get("stream_options") or {}).get("include_usage"):
            chunks.append(dict(base, choices=[], usage=full["usage"]))
        return chunks

    # -- HTTP --------------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return
        self.clients.append(tuple(scope["client"]) if scope.get("client") else None)
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        await self._until_disconnect(self._respond(scope, body, send), receive)

    async def _until_disconnect(self, work, receive) -> None:
        """Run ``work``; if the client closes the connection first, cancel it and count an abort
        (what a real engine does to free the request's slot)."""
        task = asyncio.current_task()
        done = False

        def on_message(watcher: asyncio.Future) -> None:
            if done or watcher.cancelled() or watcher.exception() is not None:
                return
            if watcher.result().get("type") == "http.disconnect":
                task.cancel()

        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(on_message)
        try:
            await work
        except asyncio.CancelledError:
            if not watcher.done():
                raise
            task.uncancel()
            self.aborted += 1
            self.aborted_at.append(time.monotonic())
        finally:
            done = True
            watcher.cancel()

    async def _respond(self, scope: dict, body: bytes, send) -> None:
        status, payload, stream = await self._handle(scope, body)
        if stream is None:
            data = json.dumps(payload).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for k, chunk in enumerate(stream):
            if self.break_stream_after is not None and k >= self.break_stream_after:
                self.break_stream_after = None
                raise ConnectionAbortedError("the fake engine drops this stream on purpose")
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def _handle(self, scope: dict, body: bytes) -> tuple[int, dict, list | None]:
        if self.api_key is not None:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if auth != f"Bearer {self.api_key}".encode():
                return 401, self._error("bad api key", 401), None
        path = scope["path"]
        if path == "/v1/models":
            return (
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "owned_by": "fake", "max_model_len": self.max_model_len}
                        for m in [self.model, *self.extra_models]
                    ],
                },
                None,
            )
        if path not in ("/v1/chat/completions", "/v1/completions"):
            return 404, self._error(f"no route {path}", 404), None
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        try:
            req = json.loads(body)
            self.requests.append(req)
            if self.fail_next:
                status = self.fail_next.popleft()
                return status, self._error(f"injected failure {status}", status), None
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.hold is not None:
                await asyncio.to_thread(self.hold.wait, 30)
            if path == "/v1/chat/completions":
                wire = dict(req, return_token_ids=True, logprobs=True) if req.get("stream") else req
                status, out = self.chat(wire)
                if status == 200 and req.get("stream"):
                    return 200, {}, self._versioned(self.chat_chunks(req, out))
            else:
                wire = dict(req, return_token_ids=True) if req.get("stream") else req
                status, out = self.completion(wire)
                if status == 200 and req.get("stream"):
                    return 200, {}, self._versioned(self.completion_chunks(req, out))
            return status, (self._versioned([out])[0] if status == 200 else out), None
        finally:
            self.in_flight -= 1

    def _versioned(self, bodies: list[dict]) -> list[dict]:
        return bodies if self.model_version is None else [dict(b, model_version=self.model_version) for b in bodies]

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> FakeEngine:
        from agl_trainer.http import BackgroundServer

        server = BackgroundServer(
            self, host=self.host, port=self.port, name="fake-engine", loop="uvloop", http="httptools", backlog=4096
        )
        self.port = server.port
        self._server = server.start(10)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(10)
            self._server = None

    def __enter__(self) -> FakeEngine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="a fake engine in vLLM's token-id dialect (a test double)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    engine = FakeEngine(host=args.host, port=args.port)
    uvicorn.run(
        engine,
        host=args.host,
        port=args.port,
        lifespan="off",
        access_log=False,
        log_level="warning",
        http="httptools",
        loop="uvloop",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
