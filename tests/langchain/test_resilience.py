"""The handler never breaks the agent: internal failures are logged once and counted."""

from __future__ import annotations

import logging
from uuid import uuid4

import agl
from agl_langchain import AglCallbackHandler
from tests.langchain.fakes import fake_model
from tests.langchain.test_graph import writer_graph


class BrokenWriter:
    """A writer whose every put fails, standing in for a store that is gone."""

    def __init__(self):
        self.calls = 0

    def put(self, item):
        self.calls += 1
        raise OSError("disk on fire")


def test_internal_failure_leaves_the_result_unchanged(caplog):
    replies = ["a draft", "bad", "a better draft", "good"]
    expected = writer_graph(fake_model(replies)).invoke({"topic": "owls"})

    broken = BrokenWriter()
    handler = AglCallbackHandler(writer=broken)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="agl_langchain"):
        got = writer_graph(fake_model(replies)).invoke({"topic": "owls"}, config={"callbacks": [handler]})

    assert got == expected
    assert broken.calls > 5 and handler.errors == broken.calls
    # one warning, with its traceback, per callback that failed; the repeats only counted
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(r.getMessage().split(" failed")[0] for r in warnings) == sorted(
        f"agl_langchain: {where}" for where in handler.error_guard.errors
    )
    assert all("disk on fire" in str(r.exc_info[1]) for r in warnings)
    assert sum(handler.error_guard.errors.values()) == broken.calls
    assert handler.open_runs() == 0


async def test_internal_failure_in_async_runs(cap):
    handler = AglCallbackHandler(writer=BrokenWriter())  # type: ignore[arg-type]
    model = fake_model(["fine"])
    assert (await model.ainvoke("hi", config={"callbacks": [handler]})).content == "fine"
    assert handler.errors == 1


def test_bad_callback_arguments_are_counted_not_raised():
    handler = AglCallbackHandler()
    handler.on_llm_end(object(), run_id=uuid4())  # unknown run: ignored
    run_id = uuid4()
    handler.on_chat_model_start(None, "not messages", run_id=run_id)  # type: ignore[arg-type]
    handler.on_llm_end(object(), run_id=run_id)  # not an LLMResult
    assert handler.errors >= 1


def test_open_runs_are_bounded(cap):
    handler = AglCallbackHandler(writer=cap.writer, max_open_runs=3)
    ids = [uuid4() for _ in range(5)]
    with agl.use_rollout(cap.ctx):
        for run_id in ids:
            handler.on_chain_start({}, {}, run_id=run_id, name=f"c{ids.index(run_id)}")
    assert handler.open_runs() == 3
    evicted = cap.spans()
    assert [s.name for s in evicted] == ["c0", "c1"]
    assert all(s.attributes["agl.incomplete"] is True and s.status == "unset" for s in evicted)


class _FailingRuns(dict):
    """The handler's table of open runs, failing on every look-up: an internal error inside any callback."""

    def _fail(self, *args, **kwargs):
        raise RuntimeError("run table broken")

    get = pop = __getitem__ = __setitem__ = __contains__ = _fail


CALLBACK_ARGS = {
    "on_chat_model_start": (None, [[]]),
    "on_llm_start": (None, ["hi"]),
    "on_llm_end": (None,),
    "on_llm_error": (ValueError("x"),),
    "on_tool_start": (None, "{}"),
    "on_tool_end": ("out",),
    "on_tool_error": (ValueError("x"),),
    "on_retriever_start": (None, "q"),
    "on_retriever_end": ([],),
    "on_retriever_error": (ValueError("x"),),
    "on_chain_start": (None, {}),
    "on_chain_end": ({},),
    "on_chain_error": (ValueError("x"),),
    "on_custom_event": ("agl_reward", 1.0),
}


def test_every_callback_reports_an_internal_error_under_its_name_and_returns():
    # the model callbacks hold their guard inline, the others through @guarded: each the same way
    overridden = {n for n in vars(AglCallbackHandler) if n.startswith("on_")}
    assert overridden == set(CALLBACK_ARGS)
    for name, args in CALLBACK_ARGS.items():
        handler = AglCallbackHandler()
        handler._runs = _FailingRuns()
        assert getattr(handler, name)(*args, run_id=uuid4(), parent_run_id=uuid4()) is None
        assert dict(handler.error_guard.errors) == {name: 1}, name
