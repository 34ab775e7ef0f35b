"""Responses API overhead against chat completions, both through the gateway, same requests, same run.

The fake engine and the gateway run in their own processes (see bench_gateway). Each
request asks the same thing (system instructions, one user message, one function tool)
once as ``/v1/chat/completions`` and once as ``/v1/responses``; both are recorded. The
difference is the cost of translating Responses to chat and back. Plain and streamed.

    .venv/bin/python -m tests.benchmarks.bench_responses [--requests 2000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from tests.benchmarks.bench_gateway import compare, print_rows, servers

TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT = {
    "model": "gpt-4o",
    "max_tokens": 64,
    "temperature": 0.7,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "tools": [{"type": "function", "function": TOOL}],
}
RESPONSES = {
    "model": "gpt-4o",
    "max_output_tokens": 64,
    "temperature": 0.7,
    "instructions": "You are a helpful assistant.",
    "input": "What is the capital of France?",
    "tools": [{"type": "function", **TOOL}],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        "engine, gateway and load generator in separate processes"
    )
    tmp = tempfile.mkdtemp(prefix="agl-bench-")
    rows = []
    try:
        with servers(tmp) as (_, via, _db):
            for stream in (False, True):
                label = "stream" if stream else "plain"
                chat = dict(CHAT, stream=stream)
                resp = dict(RESPONSES, stream=stream)
                # baseline: chat completions through the gateway; measured: the Responses API through it
                rows += compare(
                    via,
                    via,
                    "/chat/completions",
                    chat,
                    args.requests,
                    args.concurrency,
                    label,
                    via_path="/responses",
                    via_body=resp,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine skews the figures)")
    print_rows(rows, "chat", "responses")
    print("added = Responses API minus chat completions, both through the gateway")


if __name__ == "__main__":
    main()
