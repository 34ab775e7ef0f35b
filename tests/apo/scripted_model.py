"""A scripted model behind a real OpenAI-compatible HTTP server on loopback.

The tests need the optimizer's answers to be known, so they come from a script, not a model:
a critique for every critique request, and rewritten prompts chosen by the prompt being
rewritten (:data:`REWRITES`). Asked for any other model (``hosted-agent``, or the model name an
agent's role asks for) it plays a hosted model an agent calls directly (not through agl's
gateway): it answers ``reply: <last user text>``.

The server is real (``http.server`` on 127.0.0.1, the ``openai`` client talks to it over
HTTP); only the model is a script. Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPTIMIZER = "scripted-optimizer"
HOSTED = "hosted-agent"
CRITIQUE = "The instructions never say what the answers need: brevity, politeness, exactness."
REWRITES = {
    "polite": "Here you go:\n```\nBe brief, polite and exact.\n```",
    "brief": "I cannot rewrite this.",  # no fenced block: a weak model's answer
    "": "```text\nBe brief.\n```\nand\n```\nBe brief and polite.\n```",
}
"""The rewrite answer for a prompt holding the key (the first key that matches, in this order)."""


def _answer(body: dict) -> str:
    messages = body.get("messages") or []
    last = str(messages[-1].get("content", "")) if messages else ""
    if body.get("model") != OPTIMIZER:
        return f"reply: {last}"
    if "explain briefly what in the instructions led to the mistakes" in str(messages[0].get("content", "")):
        return CRITIQUE
    prompt = last.split("```", 2)[1] if last.count("```") >= 2 else ""
    return next(answer for key, answer in REWRITES.items() if key in prompt)


class ScriptedModel:
    """``with ScriptedModel() as model: model.url`` (``http://127.0.0.1:PORT/v1``)."""

    def __init__(self):
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": OPTIMIZER, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                text = _answer(body)
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                self._send(
                    {
                        "id": "chatcmpl-scripted",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model"),
                        "choices": [choice],
                        "usage": usage,
                    }
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedModel:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def asked(self, kind: str) -> list[dict]:
        """The requests of one kind: ``critique``, ``rewrite`` or ``hosted``."""

        def kind_of(body: dict) -> str:
            if body.get("model") != OPTIMIZER:
                return "hosted"
            return "critique" if "led to the mistakes" in body["messages"][0]["content"] else "rewrite"

        return [b for b in self.requests if kind_of(b) == kind]
