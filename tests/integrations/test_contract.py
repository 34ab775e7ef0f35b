"""One contract across the four integrations (``agl.capture.integration``): instrument, uninstrument, instrumented.

Each case drives the real framework: a LangChain fake chat model, AutoGen's replay client,
an Agents SDK generation span and an OpenTelemetry GenAI span, each inside a rollout whose
spans land in a real SQLite store. The integration's state is put back as it was after
each case (the Agents SDK keeps its processors for the whole process).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest

import agl
from agl.capture import BufferedWriter
from agl.capture.integration import switch_name
from agl.capture.patching import Patches
from agl.store.sqlite import SqliteStore


def _langchain_call() -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    GenericFakeChatModel(messages=iter([AIMessage(content="hi")])).invoke("hello")


def _autogen_call() -> None:
    from autogen_core.models import UserMessage
    from autogen_ext.models.replay import ReplayChatCompletionClient

    asyncio.run(ReplayChatCompletionClient(["hi"]).create([UserMessage(content="hello", source="user")]))


def _openai_agents_call() -> None:
    from agents.tracing import generation_span, trace

    with trace("contract"), generation_span(input=[{"role": "user", "content": "hello"}], model="m") as span:
        span.span_data.output = [{"role": "assistant", "content": "hi"}]


def _otel_call() -> None:
    from opentelemetry import trace

    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.system": "openai"}
    with trace.get_tracer("agl-contract-test").start_as_current_span("chat m", attributes=attributes):
        pass


@dataclass(frozen=True)
class Case:
    package: str
    recorder: str
    """The class of what ``instrument()`` returns, as ``module:Name``."""
    call: Callable[[], None]
    """One model call through the framework."""
    zero_line_switch: bool = True


CASES = [
    Case("agl_langchain", "agl_langchain.handler:AglCallbackHandler", _langchain_call),
    Case("agl_autogen", "agl.capture.patching:Patches", _autogen_call),
    Case("agl_openai_agents", "agl_openai_agents.processor:AglTracingProcessor", _openai_agents_call),
    Case("agl_otel", "agl_otel.processor:AglSpanProcessor", _otel_call, zero_line_switch=False),
]


def _class(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture
def rollout(tmp_path) -> Iterator[Callable[[], int]]:
    """Inside a rollout: a function counting its ``llm`` spans."""
    store = SqliteStore(tmp_path / "agl.db")
    writer = BufferedWriter(store, interval_s=0.05)
    ctx = agl.RolloutContext(rollout_id="ro-contract", writer=writer)

    def llm_spans() -> int:
        writer.flush()
        return len(list(store.query_spans(rollout_id="ro-contract", kind="llm")))

    with agl.use_rollout(ctx):
        yield llm_spans
    writer.close()
    store.close()


@pytest.fixture
def integration(request, monkeypatch) -> Iterator[ModuleType]:
    """The case's package with capture off, its earlier state restored afterwards."""
    case: Case = request.param
    module = importlib.import_module(case.package)
    monkeypatch.delenv(switch_name(case.package), raising=False)
    was_on = module.instrumented()
    module.uninstrument()
    yield module
    module.uninstrument()
    if was_on:
        module.instrument()


@pytest.mark.parametrize(
    ("case", "integration"), [(c, c) for c in CASES], ids=[c.package for c in CASES], indirect=["integration"]
)
def test_instrument_uninstrument_instrumented(case: Case, integration: ModuleType, rollout):
    assert not integration.instrumented()
    case.call()
    assert rollout() == 0  # off: nothing captured

    recorder = integration.instrument()
    assert isinstance(recorder, _class(case.recorder))
    assert integration.instrumented()
    assert integration.instrument() is recorder  # idempotent: the same recorder, nothing added twice
    case.call()
    assert rollout() == 1

    assert integration.uninstrument() is None
    assert not integration.instrumented()
    integration.uninstrument()  # idempotent
    case.call()
    assert rollout() == 1  # nothing more after uninstrument


@pytest.mark.parametrize("case", CASES, ids=[c.package for c in CASES])
def test_every_integration_has_the_same_names(case: Case):
    package = importlib.import_module(case.package)
    instrument = importlib.import_module(f"{case.package}.instrument")
    for name in ("instrument", "uninstrument", "instrumented"):
        assert name in package.__all__ and getattr(package, name) is getattr(instrument, name)
        assert not [p for p in inspect.signature(getattr(package, name)).parameters.values() if p.default is p.empty]
    assert inspect.signature(package.instrumented).return_annotation in ("bool", bool)
    assert inspect.signature(package.uninstrument).return_annotation in ("None", None)
    assert callable(instrument.check_framework_version) and isinstance(instrument.TESTED, str)
    if case.zero_line_switch:
        assert switch_name(case.package) == instrument.ENV_VAR
        assert callable(instrument.autoload)
    else:  # agl-otel starts through opentelemetry-instrument, not a .pth file of its own
        assert not hasattr(instrument, "autoload")


def test_the_patches_instrument_returns_are_the_hooks_in_place():
    import agl_autogen

    agl_autogen.uninstrument()
    try:
        patches = agl_autogen.instrument()
        assert isinstance(patches, Patches) and len(patches) > 0
    finally:
        agl_autogen.uninstrument()
    assert len(patches) == 0


def test_agl_otel_declares_the_sdk_it_instruments_as_its_pyproject_does():
    """OpenTelemetry's own dependency check (run by instrument() and opentelemetry-instrument) sees the SDK range."""
    import tomllib
    from pathlib import Path

    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
    from packaging.requirements import Requirement

    from agl_otel import AglInstrumentor
    from agl_otel.instrument import INSTRUMENTS

    pyproject = Path(__file__).resolve().parents[2] / "integrations" / "otel" / "pyproject.toml"
    declared = {
        Requirement(d).name: str(Requirement(d))
        for d in tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    }
    assert AglInstrumentor().instrumentation_dependencies() == INSTRUMENTS
    assert [str(Requirement(r)) for r in INSTRUMENTS] == [declared["opentelemetry-sdk"]]
    assert get_dependency_conflicts(INSTRUMENTS) is None  # the installed SDK is one it instruments
    conflict = get_dependency_conflicts(["opentelemetry-sdk>=99"])
    assert conflict is not None and "opentelemetry-sdk>=99" in str(conflict)  # what an SDK outside the range meets
