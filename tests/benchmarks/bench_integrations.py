"""Per-call overhead of agl-autogen, agl-openai-agents and agl-otel (target: at most 50 µs p50 added).

Run: ``.venv/bin/python -m tests.benchmarks.bench_integrations``. Each figure is printed
next to a baseline measured in the same run: the same call without agl. Spans go
through a real BufferedWriter into a SQLite store in a temporary directory.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import agl
from agl.capture import BufferedWriter, RolloutContext
from agl.store.sqlite import SqliteStore

N = 3000


def _pct(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def _report(name: str, base: list[float], with_agl: list[float]) -> None:
    b50, b99 = _pct(base)
    a50, a99 = _pct(with_agl)
    verdict = "ok" if a50 - b50 <= 50 else "OVER TARGET"
    print(
        f"{name:<34} baseline p50 {b50:8.1f} µs p99 {b99:8.1f} | with agl p50 {a50:8.1f} µs p99 {a99:8.1f} "
        f"| added p50 {a50 - b50:6.1f} µs ({verdict})"
    )


MESSAGES_TEXT = [("system", "You are a helpful assistant."), ("user", "What is the weather in Oslo today? " * 4)]


def bench_autogen() -> None:
    from autogen_core.models import SystemMessage, UserMessage
    from autogen_ext.models.replay import ReplayChatCompletionClient

    from agl_autogen import AglChatCompletionClient

    messages = [SystemMessage(content=MESSAGES_TEXT[0][1]), UserMessage(content=MESSAGES_TEXT[1][1], source="user")]

    async def run(client) -> list[float]:
        out = []
        for _ in range(N):
            t = time.perf_counter()
            await client.create(messages)
            out.append(time.perf_counter() - t)
        return out

    base = asyncio.run(run(ReplayChatCompletionClient(["sunny"] * N)))
    wrapped = asyncio.run(run(AglChatCompletionClient(ReplayChatCompletionClient(["sunny"] * N))))
    _report("autogen: ChatCompletionClient.create", base, wrapped)


def bench_openai_agents() -> None:
    from agents.tracing import agent_span, generation_span, trace
    from agents.tracing.setup import get_trace_provider

    from agl_openai_agents import AglTracingProcessor

    provider = get_trace_provider()
    provider.set_processors([])  # no OpenAI exporter in the measurement: only the SDK's own span cost
    data_in = [{"role": r, "content": c} for r, c in MESSAGES_TEXT]
    data_out = [{"role": "assistant", "content": "sunny", "tool_calls": None}]

    def run() -> list[float]:
        out = []
        with trace("bench"), agent_span(name="forecaster"):
            for _ in range(N):
                t = time.perf_counter()
                with generation_span(model="gpt-4o", input=data_in) as span:
                    span.span_data.output = data_out
                    span.span_data.usage = {"input_tokens": 30, "output_tokens": 2}
                out.append(time.perf_counter() - t)
        return out

    base = run()
    provider.set_processors([AglTracingProcessor()])
    with_agl = run()
    provider.set_processors([])
    _report("openai-agents: generation span", base, with_agl)


def bench_otel() -> None:
    import json

    from opentelemetry.sdk.trace import TracerProvider

    from agl_otel import AglSpanProcessor

    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.input.messages": json.dumps(
            [{"role": r, "parts": [{"type": "text", "content": c}]} for r, c in MESSAGES_TEXT]
        ),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "sunny"}]}]),
    }

    def run(tp: TracerProvider) -> list[float]:
        tracer = tp.get_tracer("bench")
        out = []
        for _ in range(N):
            t = time.perf_counter()
            with tracer.start_as_current_span("chat gpt-4o", attributes=attrs):
                pass
            out.append(time.perf_counter() - t)
        return out

    base = run(TracerProvider())
    tp = TracerProvider()
    tp.add_span_processor(AglSpanProcessor())
    _report("otel: GenAI chat span", base, run(tp))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "agl.db")
        writer = BufferedWriter(store)
        with agl.use_rollout(RolloutContext(rollout_id="ro-bench", writer=writer)):
            print(f"per-call overhead, {N} calls each (p50 target: at most 50 µs added)")
            bench_autogen()
            bench_openai_agents()
            bench_otel()
        writer.close()
        print(f"spans written to the store: {store.stats().spans}")
        store.close()


if __name__ == "__main__":
    main()
