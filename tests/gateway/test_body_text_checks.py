"""The gateway's body check given the JSON text (issue 46): the walk for lone surrogates is spared
only for text that cannot hold one, so every way a surrogate can arrive is still a 400."""

from __future__ import annotations

import json

import pytest

from agl.capture.writer import BufferedWriter
from agl.store import open_store
from agl_trainer.gateway.app import _json_body
from agl_trainer.gateway.errors import GatewayError
from agl_trainer.gateway.recorder import CallMeta, ChoiceTokens, Recorder

LONE = {
    "lower-case escape": b'{"messages": [{"role": "user", "content": "hi \\ud800"}]}',
    "upper-case escape": b'{"messages": [{"role": "user", "content": "hi \\uDFFF"}]}',
    "raw UTF-8 bytes of a surrogate": b'{"messages": [{"role": "user", "content": "hi \xed\xa0\x80"}]}',
    "UTF-16 text": '{"messages": [{"role": "user", "content": "hi \\ud800"}]}'.encode("utf-16-le"),
    "a key": b'{"metadata": {"\\udfff": 1}}',
}


@pytest.mark.parametrize("text", list(LONE.values()), ids=list(LONE))
def test_a_lone_surrogate_is_refused_however_the_text_carries_it(text):
    with pytest.raises(GatewayError) as caught:
        _json_body(text)
    assert caught.value.status == 400 and "lone surrogate" in str(caught.value)


def test_text_without_surrogates_passes_and_a_pair_is_fine():
    for text in (
        b'{"messages": [{"role": "user", "content": "plain"}]}',
        '{"messages": [{"role": "user", "content": "caf\u00e9 \ud55c"}]}'.encode(),  # ED 95 9C: Hangul, not a surrogate
        b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
    ):
        assert _json_body(text) == json.loads(text)


def test_a_checked_request_is_stored_as_it_came_and_an_unchecked_one_is_still_checked(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/agl.db")
    writer = BufferedWriter(store)
    recorder = Recorder(writer)
    req = _json_body(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}')
    meta = CallMeta("chatcmpl-1", None, [0], "chat.completions", "m", req, request_checked=True)
    recorder.record(meta, [1, 2], [ChoiceTokens(0, [3], [-0.5])], {"id": "chatcmpl-1", "choices": []})
    aborted = CallMeta("chatcmpl-2", None, [1], "chat.completions", "m", req, request_checked=True)
    recorder.record_aborted(aborted)
    writer.close()
    calls = {c.call_id: c for c in store.query_llm_calls()}
    assert calls["chatcmpl-1"].request == req and list(calls["chatcmpl-1"].prompt_ids) == [1, 2]
    assert calls["chatcmpl-2"].request == req and calls["chatcmpl-2"].aborted

    unchecked = CallMeta("chatcmpl-3", None, [0], "chat.completions", "m", {"temperature": float("nan")})
    with pytest.raises(ValueError, match="request.temperature|finite"):
        recorder.record(unchecked, [1], [ChoiceTokens(0, [3], None)], {"id": "chatcmpl-3"})
