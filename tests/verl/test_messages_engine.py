"""Anthropic's Messages API through the gateway in front of the real transformers engine.

The engine serves a tiny random model (tests/verl/conftest.py): fast, with a real
tokenizer and chat template, so what the gateway and the engine do together is checked
on real ids: the stop string that ended an answer named (``stop_reason:
"stop_sequence"``), a prefill continued (the stored prompt ids are
``apply_chat_template(..., continue_final_message=True)``'s), text streamed as it is
generated when tools are offered, images refused in the Messages API's terms, and the
engine's auth scheme taken in any case.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from agl.schema import Rollout, Task
from agl.store.sqlite import SqliteStore
from agl_trainer.gateway import Gateway
from tests.gateway.test_messages import TOOLS

ENGINE_KEY = "engine-secret"  # tests/verl/conftest.py's tiny_engine
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "the weather in paris is"}]
PREFILLED = [*QUESTION, {"role": "assistant", "content": "the"}]
"""Greedy, the tiny model continues this prefill with ``thethethe...`` (without one it writes newlines only)."""


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def stack(tiny_engine, tmp_path_factory):
    """A gateway (SQLite store) in front of the tiny engine, a running rollout, and its key."""
    with (
        SqliteStore(tmp_path_factory.mktemp("store") / "store.db") as store,
        Gateway(store, [tiny_engine.urls[0]], token="tok", upstream_api_key=ENGINE_KEY) as gw,
    ):
        store.add_tasks([Task(task_id="t", input={})])
        store.enqueue([Rollout(rollout_id="ro-engine", task_id="t")])
        store.claim("runner", limit=1)
        yield gw, store, gw.rollout_key("ro-engine", store.get_rollout("ro-engine").attempt)


@pytest.fixture(scope="module")
def claude(stack):
    gw, _, key = stack
    with anthropic.Anthropic(base_url=gw.rollout_anthropic_url("ro-engine"), api_key=key, max_retries=0) as c:
        yield c


def _last_call(stack, call_id: str):
    gw, store, _ = stack
    gw.flush()
    [call] = [c for c in store.query_llm_calls(rollout_id="ro-engine") if c.call_id == call_id]
    return call


def _answer(claude, stream: bool, **body):
    if not stream:
        return claude.messages.create(**body, extra_body=GREEDY)
    with claude.messages.stream(**body, extra_body=GREEDY) as s:
        deltas = [e.text for e in s if e.type == "text"]
        msg = s.get_final_message()
    assert "".join(deltas) == "".join(b.text for b in msg.content if b.type == "text")
    return msg


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_stop_sequence_is_named_in_stop_reason(claude, stream):
    free = _answer(claude, stream, model="m", max_tokens=24, messages=PREFILLED).content[0].text
    assert free.startswith("thethe")  # the tiny model, greedy, repeats the prefill's word
    msg = _answer(claude, stream, model="m", max_tokens=24, messages=PREFILLED, stop_sequences=["never-seen", "et"])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "et")
    assert msg.content[0].text == "th"  # cut before the stop string, as Claude answers


def test_the_engine_names_the_stop_string_as_vllm_does(tiny_engine):
    body = {"model": "m", "messages": PREFILLED, "max_tokens": 24, "temperature": 0, "continue_final_message": True}
    auth = {"Authorization": f"Bearer {ENGINE_KEY}"}
    base = tiny_engine.urls[0]
    free = httpx.post(f"{base}/chat/completions", json=body, headers=auth, timeout=60).json()["choices"][0]
    assert free["stop_reason"] is None and free["finish_reason"] == "length"
    cut = httpx.post(f"{base}/chat/completions", json=body | {"stop": ["never-seen", "eth"]}, headers=auth, timeout=60)
    assert cut.json()["choices"][0]["stop_reason"] == "eth"
    streamed = body | {"stop": ["eth"], "stream": True}
    with httpx.stream("POST", f"{base}/chat/completions", json=streamed, headers=auth, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    ends = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [(e["finish_reason"], e["stop_reason"]) for e in ends] == [("stop", "eth")]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_prefill_is_continued_with_the_templates_continued_ids(claude, stack, tokenizer, stream):
    prefill = "the weather in paris"
    messages = [*QUESTION, {"role": "assistant", "content": prefill}]
    msg = _answer(claude, stream, model="m", max_tokens=8, messages=messages)
    call = _last_call(stack, msg.id)
    continued = tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=True, return_dict=False)
    closed = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(call.prompt_ids) == list(continued) != list(closed)
    assert tokenizer.decode(list(call.prompt_ids)).endswith(prefill)
    assert msg.usage.input_tokens == len(continued)


def test_text_streams_as_it_comes_when_tools_are_offered(claude):
    """The tiny model writes no ``<tool_call>``: its text can be no call and comes in many deltas."""
    body = {"model": "m", "max_tokens": 24, "tools": TOOLS, "messages": PREFILLED, "extra_body": GREEDY}
    plain = claude.messages.create(**body)
    with claude.messages.stream(**body) as s:
        deltas = [e.text for e in s if e.type == "text"]
        streamed = s.get_final_message()
    [text] = plain.content
    assert text.text.startswith("thethe") and "<tool_call>" not in text.text
    assert len(deltas) > 3 and "".join(deltas) == text.text == streamed.content[0].text


def test_an_image_is_refused_in_the_messages_apis_terms(claude):
    image = {"type": "image", "source": {"type": "url", "url": "https://example.invalid/cat.png"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]
        )
    message = caught.value.body["error"]["message"]
    assert message.startswith("messages: image blocks are not supported") and "image_url" not in message


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_the_engine_takes_the_auth_scheme_in_any_case(tiny_engine, scheme):
    r = httpx.get(f"{tiny_engine.urls[0]}/models", headers={"Authorization": f"{scheme} {ENGINE_KEY}"})
    assert r.status_code == 200
    wrong = httpx.get(f"{tiny_engine.urls[0]}/models", headers={"Authorization": f"{scheme} not-the-key"})
    assert wrong.status_code == 401
