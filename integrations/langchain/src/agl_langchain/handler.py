"""The LangChain callback handler that turns runs into agl spans and rewards.

Every LangChain run (chat model, tool, chain, LangGraph node) becomes one
:class:`agl.Span` when it ends; the start callback only remembers what the end
needs. Span ids are the LangChain run ids, so a run id handed out by LangChain
(``config={"run_id": ...}``) is also the id to reward later. Spans go to the
buffered writer of the current rollout (or the production writer outside one);
the handler never does I/O itself.

The handler must never break the agent it watches: every callback is
:func:`agl.capture.guarded` (``on_chat_model_start`` and ``on_llm_end``, on every chat-model
call's path, write the same ``try`` inline), so an internal failure is logged the first time its
callback fails, counted in :attr:`AglCallbackHandler.errors` and otherwise ignored.

What it costs, against 28dbf9d in the same run (``python -m tests.benchmarks.bench_langchain_ab
--other <28dbf9d checkout> --rounds 5 [--bytecode-cache]``, fresh processes taking turns,
2026-11-29 19:09-19:18, load average 3.7-6.3 on the 2 shared cores): a fake chat model's call
(80-86 µs plain) took +40.3 µs p50 with the handler and +37.7 µs zero-line, against 28dbf9d's +45.1
/ +42.8 (medians of 25 rounds in 5 runs, one with ``--bytecode-cache``; 0.89 and 0.88 of 28dbf9d's;
each run's medians +40.8 / +37.9 against +45.4 / +43.7, +40.7 / +38.5 against +44.7 / +42.3, +40.0
/ +37.9 against +45.9 / +42.7, +39.5 / +37.2 against +45.1 / +43.1, and with compiled bytecode
+40.4 / +37.4 against +44.5 / +42.2). With the writer sorting a batch in one pass as well
(:mod:`agl.capture.writer`), two more runs (19:23-19:25, load average 3.6-5.9): +40.1 / +37.1
against +45.9 / +43.1 and +40.1 / +38.0 against +45.2 / +43.1. The code before (5a51c2c) had +49.4
/ +44.6 against +45.9 / +44.1 (5 rounds, load average 7-10). LangChain's own dispatch to a handler
is about 30 µs of it (on Python 3.11 a third of that is ``isinstance(handler,
_StreamingCallbackHandler)`` in ``BaseChatModel._should_stream``, a runtime-checkable Protocol,
whatever the handler). agl's two callbacks alone (``python -m
tests.benchmarks.bench_langchain_callbacks --rounds 5``: the arguments LangChain passed them,
thread CPU time; 19:22, load average 5.2-5.6) took 8.26 µs with a writer that drops what it is
given against 28dbf9d's 12.46 (0.66x), and 11.32 with a rollout's writer into SQLite against 14.59
(0.78x); against 5a51c2c's, 8.25 against 12.64 and 11.27 against 15.76. What took it down: the span
made by :func:`agl.capture.spans.finished_span` (the model's checks without its validator's pass:
3.0 µs where ``Span(...)`` took 6.3), the guard of the two model callbacks written inline
(``@guarded``'s extra call, passing LangChain's eight keyword arguments on, cost 0.5 µs a callback;
:func:`agl.capture.guarded` still guards every other callback), LangChain's arguments taken by name
instead of ``kwargs.get``, the parent run looked up once, the run popped once at its end, and a
shared empty mapping where a missing one was read.

A process of 5,000 calls with capture on (``AGL_LANGCHAIN_INSTRUMENT=1``, a SQLite store) peaked
4.8 MiB above one without (5 rounds: 4.7-5.0; 28dbf9d in the same run: 11.7; in another run 4.6-4.9
against c82b339's 5.4-7.1, the code before packing), and 4.4 MiB (4.3-4.8;
28dbf9d: 9.2) run as an installed package runs (``--bytecode-cache``: here
``PYTHONDONTWRITEBYTECODE`` has each process compile agl's sources again, which leaves the
compiler's memory behind); 2026-11-29 evening, load average 5-7. What is left, stage by stage in
a capturing process compiling its sources: ``sqlite3`` and SQLite's library about 1.0 MiB, agl's
modules 2.1 and agl-langchain's 1.0 (compiled at import), opening the store 0.5 (mostly SQLite's
code), the writer's thread, connection and first batches 0.35, the 5,000 calls 0.4-0.55.

With the spans made by finished_span (19:09-19:19, load average 3.7-6.5): 4.8 MiB (4.5-5.5 over 20
rounds, 28dbf9d 11.1-12.0 in the same rounds), 4.3 with compiled bytecode (4.2-4.8; 28dbf9d
8.8-10.2), and 4.8 against 5a51c2c's 4.9 in one run of 6 rounds: no more than before; the rounds
above 5 come and go with the load, as below.

It was 10.3 MiB that morning; what took it down: the writer connection's page cache at 256 KiB
instead of 2 MiB (about 1.9 MiB), seven INSERT texts per table instead of one per batch size
(0.7), the production writer's smaller batch (1.2), no ``packaging`` (0.6) and no plugin registry
or pluggy (0.5) in a capturing process, model validators built on first use (0.2); then (5.2-5.7
MiB that afternoon) the spans waiting for the writer held as the rows their store will insert
(:mod:`agl.store.packed`; the production writer packs each span as it is put, ``pack_after=0``):
about 1 KB a span where the span's objects took 2.4.

The figure moves with the host's load, through the spans waiting: those put while the writer
thread waits for a CPU stay in memory. The writer wakes once 64 wait and writes them in 0.5-0.8
ms, but on this host it goes unscheduled for up to 200-500 ms at times, and in single capture-on
processes the most spans ever waiting ranged from 150 to 750 between runs. Unpacked (before), the
5,000 calls added 1.2-2.4 MiB with 202-650 waiting (5.7 MiB in all at load average 10-14); packed
behind a full batch only, 0.5-0.6 MiB; each span packed, 0.3 (same-run A/B of single processes, 6
rounds each, load average 6-10: peak 69.63 against 69.97 MiB). Tried and not kept: a put that
waits (up to 20 ms) for the writer thread while two full batches wait bounded the spans waiting to
about 190, with no gain once they are packed (peak 69.59 against 69.63 MiB, 6 rounds); loading the
SQL store's read and claim modules only when used was measured, not done: they hold about 290 KiB
of objects (``agl.store.bulk`` 95, ``listing`` 77, ``claims`` 46, ``sql.rollouts`` 44,
``sql.dashboard`` 15, ``sql.steps`` 13), but added 0.1 MiB to the process as imported (they reuse
what compiling earlier modules freed), and they are base classes of :class:`agl.store.Store` and
``SqlStore``. Compiling ``handler.py`` alone keeps about 1.8 MiB where sources are compiled at
import; split in two it kept 0.36 MiB less, which a same-run A/B (5 rounds) did not show (6.1
against 5.7 MiB), so the module was left whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage

from agl.capture import (
    BufferedWriter,
    ErrorGuard,
    RolloutContext,
    capture_context,
    current_span_id,
    guarded,
    production_writer,
)
from agl.capture.spans import finished_span
from agl.schema import Reward, Span, SpanKind, new_id
from agl_langchain.convert import message_to_dict, messages_to_dicts, to_json

log = logging.getLogger("agl_langchain")

REWARD_EVENT = "agl_reward"
"""The custom event name (``dispatch_custom_event``) the handler records as a reward."""

AGENT_METADATA_KEY = "agl_agent"
"""Run metadata that names the agent explicitly, overriding the name agl finds."""

_HIDDEN_TAG = "langsmith:hidden"


class _Run:
    """What the start callback of a run keeps until its end callback."""

    __slots__ = (
        "span_id",
        "parent_span",
        "trace_id",
        "ctx",
        "kind",
        "name",
        "start",
        "attrs",
        "prompt",
        "hidden",
        "graph",
    )

    def __init__(
        self,
        span_id: str,
        parent_span: str | None,
        trace_id: str,
        ctx: RolloutContext,
        kind: SpanKind,
        name: str,
        attrs: dict[str, Any],
        hidden: bool = False,
        graph: str | None = None,
    ):
        self.span_id = span_id
        self.parent_span = parent_span
        self.trace_id = trace_id
        self.ctx = ctx
        self.kind = kind
        self.name = name
        self.start = time.time()
        self.attrs = attrs
        self.prompt: Sequence[BaseMessage] | None = None
        self.hidden = hidden
        self.graph = graph
        """The nearest enclosing chain run outside any LangGraph node: the top-level graph."""


_DEFAULT_GRAPH_NAME = "LangGraph"
"""The name LangGraph gives a compiled graph the user did not name."""


def _ns_names(ns: str | None) -> list[str]:
    """The node names along a LangGraph checkpoint namespace (``outer:<id>|inner:<id>``)."""
    if not ns:
        return []
    return [part.split(":", 1)[0] for part in ns.split("|") if part]


def agent_name(metadata: Mapping[str, Any], graph: str | None = None) -> str | None:
    """The agent a run belongs to: the named graph or subgraph the user created.

    In order: ``agl_agent`` run metadata; ``graph``, the nearest enclosing graph the
    handler saw (its ``name=``, as given to ``create_react_agent``, ``create_agent``
    or ``compile``; for an unnamed subgraph, its node in the parent graph);
    ``create_agent(name=...)`` (``lc_agent_name``); the subgraph's node from
    ``langgraph_checkpoint_ns``; the LangGraph node. Runs outside any LangGraph node
    have no agent unless named by ``agl_agent`` or ``lc_agent_name``.
    """
    return _agent(metadata, metadata.get("langgraph_node"), metadata.get("lc_agent_name"), graph)


def _agent(metadata: Mapping[str, Any], node: Any, lc_agent: Any, graph: str | None) -> Any:
    """:func:`agent_name`, given the run's ``langgraph_node`` and ``lc_agent_name`` metadata."""
    explicit = metadata.get(AGENT_METADATA_KEY)
    if explicit is not None:
        return explicit
    if node is None:
        return lc_agent
    if graph:
        return graph
    if lc_agent:
        return lc_agent
    names = _ns_names(metadata.get("langgraph_checkpoint_ns"))
    if len(names) >= 2:
        return names[-2]
    return node


def _graph_name(name: str | None) -> str | None:
    """A graph's run name, or None for LangGraph's default name."""
    return name if name and name != _DEFAULT_GRAPH_NAME else None


def _is_node_run(tags: Sequence[str] | None) -> bool:
    """Whether a chain run is a LangGraph node (Pregel tags its task runs ``graph:step:N``)."""
    return bool(tags) and any(t.startswith("graph:step:") for t in tags)


def _agent_attrs(attrs: dict[str, Any], metadata: Mapping[str, Any] | None, graph: str | None = None) -> None:
    """Copy the agent name (see :func:`agent_name`), LangGraph node and step into ``attrs``."""
    if not metadata:
        return
    get = metadata.get
    node, lc_agent = get("langgraph_node"), get("lc_agent_name")
    agent = get(AGENT_METADATA_KEY)
    if agent is None:
        agent = lc_agent if node is None else _agent(metadata, node, lc_agent, graph)
    if agent is not None:
        attrs["gen_ai.agent.name"] = agent
    if node is not None:
        attrs["agl.langgraph.node"] = node
    step = get("langgraph_step")
    if step is not None:
        attrs["agl.agent.step"] = step
    ns = get("langgraph_checkpoint_ns") or get("checkpoint_ns")
    if ns:
        attrs["agl.langgraph.checkpoint_ns"] = ns
    if lc_agent is not None:
        attrs["agl.langchain.agent_name"] = lc_agent


_EMPTY: Mapping[str, Any] = {}
"""What a missing mapping reads as: one shared, only ever read (typed ``Mapping``), instead of a new ``{}``
each time (a ``MappingProxyType``'s ``get`` costs more than making the dict)."""


def _response_attrs(attrs: dict[str, Any], response: Any) -> None:
    """A model run's result (an ``LLMResult``) into ``attrs``: output messages, finish reasons, response id, usage."""
    llm_output = response.llm_output or _EMPTY
    outputs: list[dict[str, Any]] = []
    finish_reasons: list[str] = []
    response_id = llm_output.get("id")
    usage = None
    generations = response.generations[0] if response.generations else ()
    for gen in generations:
        info = gen.generation_info or _EMPTY
        message = getattr(gen, "message", None)
        if message is None:
            out: dict[str, Any] = {"role": "assistant", "content": gen.text}
            meta: Mapping[str, Any] = _EMPTY
        else:
            out = message_to_dict(message)
            meta = message.response_metadata or _EMPTY
            if usage is None:
                usage = getattr(message, "usage_metadata", None)
            if response_id is None:
                response_id = meta.get("id")
            model = meta.get("model_name") or meta.get("model")
            if model and "gen_ai.response.model" not in attrs:
                attrs["gen_ai.response.model"] = model
        finish = info.get("finish_reason") or meta.get("finish_reason") or meta.get("stop_reason")
        if finish:
            out["finish_reason"] = finish
            finish_reasons.append(finish)
        outputs.append(out)
    attrs["gen_ai.output.messages"] = outputs
    if finish_reasons:
        attrs["gen_ai.response.finish_reasons"] = finish_reasons
    if response_id is not None:
        attrs["gen_ai.response.id"] = response_id
    if usage:
        attrs["gen_ai.usage.input_tokens"] = usage.get("input_tokens")
        attrs["gen_ai.usage.output_tokens"] = usage.get("output_tokens")
    else:
        token_usage = llm_output.get("token_usage") or llm_output.get("usage")
        if token_usage is not None and isinstance(token_usage, Mapping):
            attrs["gen_ai.usage.input_tokens"] = token_usage.get("prompt_tokens", token_usage.get("input_tokens"))
            attrs["gen_ai.usage.output_tokens"] = token_usage.get("completion_tokens", token_usage.get("output_tokens"))


def _node_graph(parent: _Run | None, metadata: Mapping[str, Any], inherited: str | None) -> str | None:
    """The agent of a LangGraph node run: the graph whose task it is.

    A node run's parent is its graph's run, named by the graph's ``name=``; an
    unnamed subgraph is named by its node in the parent graph (the second last
    part of the node's checkpoint namespace); an unnamed top-level graph by
    nothing (its nodes are the agents).
    """
    named = _graph_name(parent.name) if parent is not None else None
    if named:
        return named
    names = _ns_names(metadata.get("langgraph_checkpoint_ns"))
    if len(names) >= 2:
        return names[-2]
    return inherited if parent is None else None


def _error_attrs(error: BaseException) -> dict[str, Any]:
    return {"error.type": type(error).__name__, "error.message": str(error)}


class AglCallbackHandler(BaseCallbackHandler):
    """Records LangChain and LangGraph runs as agl spans.

    ``graph.invoke(inputs, config={"callbacks": [AglCallbackHandler()]})``, or no
    code at all with :func:`agl_langchain.instrument` or ``AGL_LANGCHAIN_INSTRUMENT=1``.

    - chat model and LLM runs become ``llm`` spans (``gen_ai.input.messages``,
      ``gen_ai.tool.definitions``, ``gen_ai.output.messages``,
      ``gen_ai.request.model``, ``gen_ai.response.id``, ``gen_ai.usage.*``),
      carrying the agent as ``gen_ai.agent.name`` (the named graph or subgraph
      the user created, see :func:`agent_name`), the LangGraph node as
      ``agl.langgraph.node`` and its step as ``agl.agent.step``;
    - tool and retriever runs become ``tool`` spans;
    - chain runs and LangGraph nodes become ``agent`` spans (runs LangGraph hides
      from tracing are skipped and their children attached to the nearest shown
      ancestor);
    - ``dispatch_custom_event("agl_reward", {"value": 1.0, "name": ...})`` becomes
      a :class:`agl.Reward` on the span of the run that dispatched it, and any other
      custom event a ``custom`` span.

    Args:
        writer: where spans go; by default the writer of the current rollout, or
            the production writer outside any rollout.
        record_chain_io: also record chain and node inputs and outputs
            (``agl.chain.inputs`` / ``agl.chain.outputs``). Off by default: graph
            state can be large and the LLM spans already hold every message.
        max_open_runs: bound on runs started but not yet ended. Past it the oldest
            is recorded as it stands (``agl.incomplete``) and forgotten, so a
            stream abandoned without an end callback cannot grow memory forever.
    """

    run_inline = True
    """Callbacks run in the thread of the run that fired them, so each sees its rollout's context."""
    raise_error = False
    """False: an error inside the handler is counted and logged (``errors``), never raised into the agent."""

    def __init__(
        self,
        *,
        writer: BufferedWriter | None = None,
        record_chain_io: bool = False,
        max_open_runs: int = 10_000,
    ) -> None:
        super().__init__()
        self.writer = writer
        """Where spans go; None: the current rollout's writer, or the production writer."""
        self.record_chain_io = record_chain_io
        """Whether chain and node inputs and outputs are recorded too."""
        self.max_open_runs = max_open_runs
        """Runs started and not ended that are kept at most (past it the oldest is recorded as incomplete)."""
        self.error_guard = ErrorGuard("agl_langchain")
        """Counts (by callback) and logs the internal errors the handler swallowed."""
        self._runs: dict[UUID, _Run] = {}

    @property
    def errors(self) -> int:
        """How many internal errors the handler swallowed."""
        return self.error_guard.total

    # -- bookkeeping -------------------------------------------------------------
    def _parent(self, parent_run_id: UUID | None) -> _Run | None:
        """The open run ``parent_run_id`` names, if the handler saw it start."""
        return self._runs.get(parent_run_id) if parent_run_id is not None else None

    def _open(
        self,
        run_id: UUID,
        parent: _Run | None,
        kind: SpanKind,
        name: str,
        attrs: dict[str, Any],
        tags: Sequence[str] | None = None,
    ) -> _Run:
        span_id = str(run_id)
        hidden = bool(tags) and _HIDDEN_TAG in tags  # type: ignore[operator]
        if parent is not None:
            parent_span = parent.parent_span if parent.hidden else parent.span_id
            run = _Run(span_id, parent_span, parent.trace_id, parent.ctx, kind, name, attrs, hidden, parent.graph)
        else:
            ctx = capture_context()
            # Inside a rollout every run shares the rollout's trace; outside one each
            # top-level run is its own trace.
            trace_id = ctx.trace_id if ctx.rollout_id is not None else span_id
            run = _Run(span_id, current_span_id(), trace_id, ctx, kind, name, attrs, hidden)
        runs = self._runs
        runs[run_id] = run
        if len(runs) > self.max_open_runs:
            self._evict_oldest()
        return run

    def _evict_oldest(self) -> None:
        try:
            oldest_id = next(iter(self._runs))
        except (StopIteration, RuntimeError):  # emptied or resized by another thread
            return
        oldest = self._runs.pop(oldest_id, None)
        if oldest is not None and not oldest.hidden:
            oldest.attrs["agl.incomplete"] = True
            log.warning(
                "agl_langchain: more than %d runs open; recording run %s unfinished", self.max_open_runs, oldest_id
            )
            self._emit(oldest, "unset")

    def _close(self, run_id: UUID, status: str, attrs: dict[str, Any] | None = None) -> _Run | None:
        run = self._runs.pop(run_id, None)
        if run is None or run.hidden:
            return None
        if attrs:
            run.attrs.update(attrs)
        self._emit(run, status)
        return run

    def _emit(self, run: _Run, status: str) -> None:
        attrs = run.attrs
        prompt = run.prompt
        if prompt is not None:
            attrs["gen_ai.input.messages"] = [message_to_dict(m) for m in prompt]
            run.prompt = None
        ctx = run.ctx
        span = finished_span(
            run.span_id,
            run.trace_id,
            run.parent_span,
            ctx.rollout_id,
            ctx.next_seq(),
            run.name,
            run.kind,
            run.start,
            time.time(),
            status,
            attrs,
        )
        (self.writer or ctx.writer or production_writer()).put(span)

    def _put(self, ctx: RolloutContext, item: Span | Reward) -> None:
        (self.writer or ctx.writer or production_writer()).put(item)

    # -- chat models and LLMs ----------------------------------------------------
    # The two callbacks of every model call hold their guard inline (the same ``try`` that
    # :func:`agl.capture.guarded` wraps around the others, reported under the callback's name):
    # the decorator's extra call, passing LangChain's eight keyword arguments on, cost 0.5 µs a callback.
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        invocation_params: dict[str, Any] | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an ``llm`` span for a chat model run, with its prompt messages, model and tool definitions."""
        try:
            run = self._start_llm(serialized, run_id, parent_run_id, tags, metadata, invocation_params, name)
            if messages:
                run.prompt = messages[0]
                if len(messages) > 1:
                    run.attrs["agl.input.prompts"] = [messages_to_dicts(m) for m in messages]
        except Exception as exc:
            self.error_guard.report("on_chat_model_start", exc)

    @guarded
    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        invocation_params: dict[str, Any] | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an ``llm`` span for a (text-completion) LLM run, with its prompt."""
        run = self._start_llm(serialized, run_id, parent_run_id, tags, metadata, invocation_params, name)
        if prompts:
            run.attrs["gen_ai.input.messages"] = [{"role": "user", "content": prompts[0]}]
            run.attrs["gen_ai.operation.name"] = "text_completion"
            if len(prompts) > 1:
                run.attrs["agl.input.prompts"] = list(prompts)

    def _start_llm(
        self,
        serialized: dict[str, Any] | None,
        run_id: UUID,
        parent_run_id: UUID | None,
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
        invocation_params: dict[str, Any] | None,
        name: str | None,
    ) -> _Run:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        params: Mapping[str, Any] = invocation_params or _EMPTY
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        model = params.get("model") or params.get("model_name") or (metadata or _EMPTY).get("ls_model_name")
        if model is not None:
            attrs["gen_ai.request.model"] = model
        if metadata:
            provider = metadata.get("ls_provider")
            if provider:
                attrs["gen_ai.provider.name"] = provider
            _agent_attrs(attrs, metadata, parent.graph if parent is not None else None)
        if params:
            tools = params.get("tools") or params.get("functions")
            if tools:
                attrs["gen_ai.tool.definitions"] = to_json(tools)
            temperature = params.get("temperature")
            if temperature is not None:
                attrs["gen_ai.request.temperature"] = temperature
            max_tokens = params.get("max_tokens") or params.get("max_completion_tokens")
            if max_tokens is not None:
                attrs["gen_ai.request.max_tokens"] = max_tokens
        name = name or (serialized or _EMPTY).get("name") or "llm"
        return self._open(run_id, parent, "llm", name, attrs, tags)

    def on_llm_end(
        self,
        response: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Close the run's ``llm`` span with the output messages, finish reasons, response id and token usage."""
        try:
            run = self._runs.pop(run_id, None)
            if run is None or run.hidden:
                return
            _response_attrs(run.attrs, response)
            self._emit(run, "ok")
        except Exception as exc:
            self.error_guard.report("on_llm_end", exc)

    @guarded
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the run's ``llm`` span as an error (``error.type``, ``error.message``)."""
        self._close(run_id, "error", _error_attrs(error))

    # -- tools and retrievers ----------------------------------------------------
    @guarded
    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, *, run_id: UUID, **kwargs: Any) -> None:
        """Open a ``tool`` span for a tool run, with its arguments and tool-call id."""
        inputs = kwargs.get("inputs")
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.call.arguments": to_json(inputs) if inputs is not None else input_str,
        }
        call_id = kwargs.get("tool_call_id")
        if call_id:
            attrs["gen_ai.tool.call.id"] = call_id
        self._start_tool(serialized, run_id, kwargs, "tool", attrs)

    def _start_tool(
        self,
        serialized: dict[str, Any] | None,
        run_id: UUID,
        kwargs: dict[str, Any],
        default: str,
        attrs: dict[str, Any],
    ) -> None:
        """Open a ``tool`` span for a tool or retriever run, named by LangChain or else ``default``."""
        name = kwargs.get("name") or (serialized or _EMPTY).get("name") or default
        attrs["gen_ai.tool.name"] = name
        parent = self._parent(kwargs.get("parent_run_id"))
        _agent_attrs(attrs, kwargs.get("metadata"), parent.graph if parent is not None else None)
        self._open(run_id, parent, "tool", name, attrs, kwargs.get("tags"))

    @guarded
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the tool's span with its result (an error if the tool message says so)."""
        if isinstance(output, BaseMessage):
            result = output.content if isinstance(output.content, str) else to_json(output.content)
            extra: dict[str, Any] = {"gen_ai.tool.call.result": result}
            status = getattr(output, "status", None)
            if status == "error":
                self._close(run_id, "error", extra)
                return
        else:
            extra = {"gen_ai.tool.call.result": to_json(output)}
        self._close(run_id, "ok", extra)

    @guarded
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the tool's span as an error."""
        self._close(run_id, "error", _error_attrs(error))

    @guarded
    def on_retriever_start(self, serialized: dict[str, Any] | None, query: str, *, run_id: UUID, **kwargs: Any) -> None:
        """Open a ``tool`` span for a retriever run, with its query."""
        attrs: dict[str, Any] = {"gen_ai.operation.name": "retrieve", "agl.retriever.query": query}
        self._start_tool(serialized, run_id, kwargs, "retriever", attrs)

    @guarded
    def on_retriever_end(self, documents: Sequence[Any], *, run_id: UUID, **kwargs: Any) -> None:
        """Close the retriever's span with the documents it returned."""
        docs = [{"page_content": d.page_content, "metadata": to_json(d.metadata)} for d in documents]
        self._close(run_id, "ok", {"agl.retriever.documents": docs})

    @guarded
    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the retriever's span as an error."""
        self._close(run_id, "error", _error_attrs(error))

    # -- chains and LangGraph nodes ----------------------------------------------
    @guarded
    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Open an ``agent`` span for a chain run or LangGraph node (its inputs too with ``record_chain_io``)."""
        parent_run_id, tags, metadata = kwargs.get("parent_run_id"), kwargs.get("tags"), kwargs.get("metadata")
        name = kwargs.get("name") or (serialized or _EMPTY).get("name") or "chain"
        attrs: dict[str, Any] = {}
        parent = self._parent(parent_run_id)
        graph = parent.graph if parent is not None else None
        if metadata and _is_node_run(tags):
            graph = _node_graph(parent, metadata, graph)
        if metadata and metadata.get("langgraph_node") == name and (tags is None or _HIDDEN_TAG not in tags):
            attrs["gen_ai.operation.name"] = "invoke_agent"
            _agent_attrs(attrs, metadata, graph)
        if self.record_chain_io:
            attrs["agl.chain.inputs"] = to_json(inputs)
        run = self._open(run_id, parent, "agent", name, attrs, tags)
        run.graph = graph

    @guarded
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the chain's span (with its outputs with ``record_chain_io``)."""
        self._close(run_id, "ok", {"agl.chain.outputs": to_json(outputs)} if self.record_chain_io else None)

    @guarded
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the chain's span as an error."""
        self._close(run_id, "error", _error_attrs(error))

    # -- custom events: rewards from inside the agent ----------------------------
    @guarded
    def on_custom_event(
        self,
        name: str,
        data: Any,
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record an ``agl_reward`` event as a reward on the dispatching run's span, any other as a ``custom`` span."""
        run = self._runs.get(run_id)
        if run is not None:
            ctx = run.ctx
            span_id = run.parent_span if run.hidden else run.span_id
            trace_id = run.trace_id
        else:
            ctx = capture_context()
            span_id = current_span_id()
            trace_id = ctx.trace_id
        if name == REWARD_EVENT:
            reward = _reward_from_event(data, ctx, span_id)
            if reward is not None:
                self._put(ctx, reward)
                return
            log.warning("agl_langchain: %r event without a numeric value (%r); recorded as a custom span", name, data)
        t = time.time()
        attrs: dict[str, Any] = {"agl.event.data": to_json(data)}
        _agent_attrs(attrs, metadata, run.graph if run is not None else None)
        seq = ctx.next_seq()
        span = finished_span(
            new_id("event-"), trace_id, span_id, ctx.rollout_id, seq, name, "custom", t, t, "ok", attrs
        )
        self._put(ctx, span)

    # -- introspection -----------------------------------------------------------
    def open_runs(self) -> int:
        """How many runs have started and not ended yet."""
        return len(self._runs)


def _reward_from_event(data: Any, ctx: RolloutContext, span_id: str | None) -> Reward | None:
    """A :class:`Reward` from an ``agl_reward`` event's data: a number or ``{"value", "name"}``."""
    name = "reward"
    value = data
    if isinstance(data, Mapping):
        value = data.get("value")
        name = data.get("name") or name
        span_id = data.get("span_id") or span_id
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return Reward(
        rollout_id=ctx.rollout_id,
        span_id=span_id,
        name=str(name),
        value=float(value),
        source="langchain",
        seq=ctx.next_seq(),
    )


__all__ = ["AGENT_METADATA_KEY", "REWARD_EVENT", "AglCallbackHandler", "agent_name"]
