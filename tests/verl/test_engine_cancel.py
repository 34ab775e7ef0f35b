"""Cancellation: a client that disconnects frees its engine slot within a second, plain or streamed."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest

from tests.conftest import wait_until

LONG = {
    "messages": [{"role": "user", "content": "hello world ! how are you ?"}],
    "max_tokens": 900,  # about 7 s of decoding for the tiny model on one CPU
    "temperature": 0,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from agl_verl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, max_batch_size=8, max_model_len=1024)
    engine.start()
    yield engine
    engine.stop()


def assert_slot_freed_and_engine_answers(engine, client_gone: threading.Event) -> None:
    batcher = engine.batchers[0]
    assert client_gone.wait(10), "the client never disconnected"
    assert wait_until(lambda: batcher.running_rows == 0, "the batcher has freed the row", 1.0) < 1.0
    started = time.monotonic()
    short = httpx.post(engine.urls[0] + "/chat/completions", json={**LONG, "max_tokens": 5}, timeout=10)
    assert short.status_code == 200, short.text
    assert short.json()["choices"][0]["finish_reason"] == "length"
    assert time.monotonic() - started < 2.0


def test_plain_request_cancelled_on_disconnect(engine):
    batcher = engine.batchers[0]
    gone = threading.Event()

    def client() -> None:
        # the client gives up and closes its connection mid-generation
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(engine.urls[0] + "/chat/completions", json=LONG, timeout=0.6)
        gone.set()

    thread = threading.Thread(target=client)
    thread.start()
    wait_until(lambda: batcher.running_rows == 1, "one row runs", 5)
    assert_slot_freed_and_engine_answers(engine, gone)
    thread.join(5)


def test_stream_cancelled_on_disconnect(engine):
    gone = threading.Event()
    chunks = []

    def client() -> None:
        with httpx.stream("POST", engine.urls[0] + "/chat/completions", json={**LONG, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line)
                if len(chunks) >= 5:
                    break  # leaving the block closes the connection mid-stream
        gone.set()

    thread = threading.Thread(target=client)
    thread.start()
    assert_slot_freed_and_engine_answers(engine, gone)
    thread.join(5)
    assert len(chunks) == 5
