"""The two servers the fuzzer aims at, started for real on 127.0.0.1, and their routes.

:func:`store_target` serves a SQLite store with ``ServerThread`` (admin and runner
tokens, rollout keys); :func:`gateway_target` puts the gateway in front of the fake
engine (tests/fake_engine.py), with a claimed rollout whose key opens its routes.
Both are used by the fuzz test and by ``tests/benchmarks/bench_soak.py``; each target's
``served`` lists the routes its server says it serves (the fuzz test checks that every
one of them is fuzzed).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agl.credentials import RolloutKeys, new_token
from agl.schema import LLMCall, ModelVersion, Reward, Rollout, Span, Task
from agl.store.sqlite import SqliteStore
from tests.reliability.fuzz import Route, Target, served_routes, starlette_routes

MODEL = "fake-policy"


def _n(r: random.Random) -> int:
    return r.randint(0, 10**6)


def _span(r: random.Random) -> dict:
    span = Span(span_id=f"fz-s{_n(r)}", rollout_id="ro-run", seq=r.randint(0, 9), name="step", kind="tool")
    return span.model_dump(mode="json") | {"attributes": {"k": "v", "n": 1.5}}


def _call(r: random.Random) -> dict:
    call = LLMCall(call_id=f"fz-c{_n(r)}", rollout_id="ro-run", prompt_ids=[1, 2, 3], response_ids=[4, 5])
    return call.model_dump(mode="json") | {"response_logprobs": [-0.1, -0.2]}


def _reward(r: random.Random) -> dict:
    return Reward(reward_id=f"fz-r{_n(r)}", rollout_id="ro-run", value=r.random()).model_dump(mode="json")


def store_routes() -> list[Route]:
    """Every route of ``agl store serve`` (the dashboard's and the OTLP plugin's too), each with a valid body."""
    return [
        Route("GET", "/healthz", auth="none"),
        Route("GET", "/v1/stats"),
        Route("POST", "/v1/flush", lambda r: {}),
        Route("POST", "/v1/tasks", lambda r: {"tasks": [{"task_id": f"fz-t{_n(r)}", "input": {"q": _n(r)}}]}),
        Route("POST", "/v1/tasks/query", lambda r: {"split": r.choice([None, "train"])}),
        Route("GET", "/v1/tasks/query?split=train&limit=2"),
        Route("GET", "/v1/tasks/task-1"),
        Route("POST", "/v1/rollouts", lambda r: {"rollouts": [{"rollout_id": f"fz-ro{_n(r)}", "task_id": "task-1"}]}),
        Route("POST", "/v1/rollouts/query", lambda r: {"status": ["queued", "running"], "task_id": "task-1"}),
        Route("GET", "/v1/rollouts/query?status=queued&status=running&task_id=task-1"),
        Route("GET", "/v1/rollouts/{rollout}"),
        Route("GET", "/v1/rollouts/{rollout}/attempts"),
        Route("POST", "/v1/rollouts/{queued}/finish", lambda r: {"status": r.choice(["succeeded", "cancelled"])}),
        Route("POST", "/v1/rollouts/{rollout}/finish", lambda r: {"status": "succeeded", "attempt": 99}, "runner"),
        Route(
            "POST", "/v1/claims", lambda r: {"runner_id": "fz-runner", "limit": 1, "claim_id": f"c{_n(r)}"}, "runner"
        ),
        Route("POST", "/v1/heartbeats", lambda r: {"runner_id": "runner-0", "rollout_ids": ["ro-run"]}, "runner"),
        Route("POST", "/v1/cancellations", lambda r: {"rollout_ids": [f"fz-ro{_n(r)}"]}),
        Route("POST", "/v1/expirations", lambda r: {"heartbeat_timeout_s": 3600.0}),
        Route("POST", "/v1/spans", lambda r: {"spans": [_span(r)]}, "key"),
        Route("POST", "/v1/spans/query", lambda r: {"rollout_id": "ro-run", "kind": "tool"}),
        Route("GET", "/v1/spans/query?rollout_id=ro-run&kind=tool"),
        Route("POST", "/v1/llm_calls", lambda r: {"llm_calls": [_call(r)]}),
        Route("POST", "/v1/llm_calls/query", lambda r: {"rollout_ids": ["ro-run"], "call_ids": ["x"]}),
        Route("GET", "/v1/llm_calls/query?rollout_ids=ro-run&call_ids=x"),
        Route("POST", "/v1/rewards", lambda r: {"rewards": [_reward(r)]}, "key"),
        Route("POST", "/v1/rewards/query", lambda r: {"rollout_id": "ro-run", "production": False}),
        Route("GET", "/v1/rewards/query?rollout_id=ro-run&production=false"),
        Route(
            "POST",
            "/v1/batch",
            lambda r: {
                "spans": [_span(r)],
                "llm_calls": [_call(r)],
                "rewards": [_reward(r)],
                "claims": [{"runner_id": "fz-runner", "limit": 1}],
                "finishes": [{"rollout_id": f"fz-ro{_n(r)}", "status": "failed", "error": "x"}],
            },
            "runner",
        ),
        Route(
            "POST",
            "/v1/model_versions",
            lambda r: ModelVersion(version=f"v{_n(r)}", step=3, metadata={"a": 1}).model_dump(mode="json"),
        ),
        Route("GET", "/v1/model_versions/latest"),
        Route("GET", "/v1/model_versions/v1"),
        Route("POST", "/v1/run_steps", lambda r: {"run_id": "fz-run", "record": {"step": _n(r), "loss": 0.5}}),
        Route("GET", "/v1/run_steps?run_id=fz-run"),
        Route(
            "POST",
            "/v1/traces",
            lambda r: {
                "resourceSpans": [
                    {
                        "scopeSpans": [
                            {
                                "spans": [
                                    {
                                        "traceId": "5b8efff798038103d269b633813fc60c",
                                        "spanId": "eee19b7ec3c1b174",
                                        "name": "llm",
                                        "startTimeUnixNano": "1700000000000000000",
                                        "endTimeUnixNano": "1700000001000000000",
                                        "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}}],
                                    }
                                ]
                            }
                        ]
                    }
                ]
            },
        ),
        Route("GET", "/ui/rollouts?sort=reward&status=running&page=2"),
        Route("GET", "/ui/rollouts/{rollout}"),
        Route("GET", "/ui/runs"),
        Route("GET", "/ui/runs/charts?run=fz-run"),
        Route("GET", "/ui/traces"),
        Route("GET", "/ui", auth="none"),
        Route("GET", "/ui/"),
        Route("GET", "/ui/login?next=/ui/runs", auth="none"),
        Route("POST", "/ui/login", lambda r: b"token=wrong&next=/ui/runs", "none", content_type=FORM),
        Route("POST", "/ui/login", _multipart_login, "none", content_type=f"multipart/form-data; boundary={BOUNDARY}"),
        Route("POST", "/ui/logout", lambda r: b"", content_type=FORM),
        Route(
            "POST", "/ui/rollouts/{rollout}/reward", lambda r: f"value={r.random()}&name=fz".encode(), content_type=FORM
        ),
    ]


FORM = "application/x-www-form-urlencoded"
BOUNDARY = "fz-boundary"


def _multipart_login(r: random.Random) -> bytes:
    """A login form as multipart, sometimes with a file in it (a form of the dashboard holds none)."""
    parts = [b'Content-Disposition: form-data; name="token"\r\n\r\nwrong']
    if r.random() < 0.5:
        parts.append(b'Content-Disposition: form-data; name="f"; filename="a.bin"\r\n\r\n' + r.randbytes(200))
    sep = f"--{BOUNDARY}\r\n".encode()
    return b"".join(sep + part + b"\r\n" for part in parts) + f"--{BOUNDARY}--\r\n".encode()


@contextlib.contextmanager
def store_target(tmp: Path, **options: Any) -> Iterator[tuple[Target, SqliteStore]]:
    """A store server on a fresh SQLite file, with a running rollout (``ro-run``) and a queued one;
    ``options`` go to its ``ServerThread`` (``max_body_bytes``, ``header_timeout_s``, ...)."""
    from agl_trainer.store_server import ServerThread

    store = SqliteStore(tmp / "fuzz-store.db")
    store.add_tasks([Task(task_id="task-1", input={"q": 1})])
    store.enqueue([Rollout(rollout_id="ro-run", task_id="task-1"), Rollout(rollout_id="ro-queued", task_id="task-1")])
    [running] = store.claim("runner-0", limit=1)
    keys = RolloutKeys.generate()
    admin, runner = new_token(16), new_token(16)
    credentials = {
        "admin": admin,
        "runner": runner,
        "key": keys.mint(running.rollout_id, running.attempt),
        "production": new_token(16),
    }
    server = ServerThread(store, token=admin, runner_token=runner, keys=keys, expire_every_s=None, **options).start()
    placeholders = {"rollout": "ro-run", "queued": "ro-queued"}
    target = Target(server.url, credentials, placeholders, served=starlette_routes(server.app.routes))
    try:
        yield target, store
    finally:
        target.close()
        server.stop()
        store.close()


def _chat(r: random.Random) -> dict:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"hi {_n(r)}"}]
    if r.random() < 0.3:
        call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        ]
    body = {"model": MODEL, "messages": messages, "max_tokens": r.randint(1, 16), "temperature": 0.7}
    if r.random() < 0.3:
        body["stream"] = True
    if r.random() < 0.3:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {}}}},
            }
        ]
    if r.random() < 0.3:
        body |= {"logprobs": True, "top_logprobs": 2, "seed": 7, "stop": ["\n"], "n": 2}
    return body


def _responses(r: random.Random) -> dict:
    body: dict = {"model": MODEL, "input": f"hi {_n(r)}", "max_output_tokens": r.randint(1, 16)}
    if r.random() < 0.4:
        body["input"] = [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ]
    if r.random() < 0.3:
        body |= {"instructions": "be brief", "stream": r.random() < 0.5}
    return body


def _messages(r: random.Random) -> dict:
    """An Anthropic Messages body: text, or a tool_use / tool_result round trip, some of it streamed."""
    body: dict = {
        "model": "claude-sonnet-4-5",
        "max_tokens": r.randint(1, 16),
        "messages": [{"role": "user", "content": f"hi {_n(r)}"}],
    }
    if r.random() < 0.4:
        body["messages"] += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": 1}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]}
                ],
            },
        ]
    if r.random() < 0.3:
        schema = {"type": "object", "properties": {"q": {"type": "integer"}}}
        body |= {
            "tools": [{"name": "lookup", "input_schema": schema}],
            "tool_choice": {"type": r.choice(["auto", "any"])},
        }
    if r.random() < 0.3:
        body |= {
            "system": [{"type": "text", "text": "be brief"}],
            "stop_sequences": ["\n"],
            "temperature": 0.5,
            "top_k": 5,
        }
    if r.random() < 0.4:
        body["stream"] = True
    return body


def _count_tokens(r: random.Random) -> dict:
    return {
        "model": "claude-sonnet-4-5",
        "system": "be brief",
        "messages": [{"role": "user", "content": f"hi {_n(r)}"}],
    }


def _completion(r: random.Random) -> dict:
    return {"model": MODEL, "prompt": r.choice(["hello", [104, 105]]), "max_tokens": r.randint(1, 16)}


def gateway_routes() -> list[Route]:
    """The gateway's routes: production and a rollout's, and the admin routes (those that change
    what the gateway serves are only sent with credentials that must be refused)."""
    return [
        Route("GET", "/health", auth="none"),
        Route("POST", "/v1/chat/completions", _chat, "production"),
        Route("POST", "/rollouts/{rollout}/v1/chat/completions", _chat, "key"),
        Route("POST", "/rollouts/{rollout}/v1/completions", _completion, "key"),
        Route("POST", "/v1/completions", _completion, "production"),
        Route("POST", "/rollouts/{rollout}/v1/responses", _responses, "key"),
        Route("POST", "/v1/responses", _responses, "production"),
        Route("POST", "/rollouts/{rollout}/v1/messages", _messages, "key", auth_header="x-api-key"),
        Route("POST", "/v1/messages", _messages, "key", auth_header="x-api-key"),
        Route("POST", "/v1/messages", _messages, "production"),
        Route("POST", "/rollouts/{rollout}/v1/messages/count_tokens", _count_tokens, "key", auth_header="x-api-key"),
        Route("POST", "/v1/messages/count_tokens", _count_tokens, "production", auth_header="x-api-key"),
        Route("GET", "/v1/models", auth="production"),
        Route("GET", "/rollouts/{rollout}/v1/models", auth="key"),
        Route("GET", "/admin/status"),
        Route("POST", "/admin/model_version", lambda r: {"model_version": f"v{_n(r)}"}),
        Route("POST", "/admin/rollout_keys", lambda r: {"rollout_id": "ro-gw"}),
        Route("POST", "/admin/flush", lambda r: {}),
        Route("POST", "/admin/pause?timeout_s=1", lambda r: {}, good_auth_ok=False),
        Route("POST", "/admin/resume", lambda r: {}, good_auth_ok=False),
        Route("POST", "/admin/upstreams", lambda r: {"upstreams": ["http://127.0.0.1:9/v1"]}, good_auth_ok=False),
    ]


@contextlib.contextmanager
def gateway_target(tmp: Path, engine: object | None = None, **options: Any) -> Iterator[tuple[Target, object]]:
    """The gateway in front of the fake engine (``engine``, a started one, or a new one), over a
    SQLite store with one claimed rollout (``ro-gw``); ``options`` go to the ``Gateway``."""
    from agl_trainer.gateway import Gateway
    from agl_trainer.gateway.app import routes
    from tests.fake_engine import FakeEngine

    store = SqliteStore(tmp / "fuzz-gateway.db")
    store.add_tasks([Task(task_id="task-1", input={"q": 1})])
    store.enqueue([Rollout(rollout_id="ro-gw", task_id="task-1")])
    [running] = store.claim("runner-0", limit=1)
    with contextlib.nullcontext(engine) if engine is not None else FakeEngine() as engine:
        gateway = Gateway(
            store, [engine.url], token=new_token(16), admin_token=new_token(16), model_version="v1", **options
        )
        gateway.start()
        credentials = {
            "admin": gateway.admin_token,
            "production": gateway.token,
            "key": gateway.rollout_key(running.rollout_id, running.attempt),
            "runner": new_token(16),
        }
        target = Target(gateway.url, credentials, {"rollout": "ro-gw"}, served=served_routes(routes()))
        try:
            yield target, gateway
        finally:
            target.close()
            gateway.stop()
    store.close()
