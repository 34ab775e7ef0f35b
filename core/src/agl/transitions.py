"""Building transitions: from what the store holds about ended rollouts to training data.

For each ended rollout the builder

1. **joins** the framework's LLM spans (kind ``llm``) with the gateway's
   :class:`~agl.schema.LLMCall` records:

   - by response id: a span's ``gen_ai.response.id`` is the gateway's ``call_id``;
   - a span without a response id falls back to the order of calls in the rollout,
     *confirmed* by the request's messages: it takes the next not yet joined call
     whose request messages equal the span's ``gen_ai.input.messages``. If none
     does, the span is reported as unmatched (counted in :class:`BuildReport`,
     logged) and yields nothing: a call is never guessed;
   - a span whose response id the gateway never issued, or a span without one in a
     rollout with no gateway records left, had no gateway record: it yields a
     *text-only* transition (``token_source="text"``, empty token ids, the
     messages in ``prompt_messages`` / ``response_text``);
   - a gateway record no span claims (an agent with tracing off) is still a
     transition, with ``agent=None``.

2. **rewards** the rollout. Reward plugins (hook ``agl_reward``) run first and
   what they return is stored as :class:`~agl.schema.Reward` rows whose source is
   the plugin's name. The final reward is, in this order of precedence:

   1. the reward the agent function *returned* (stored by the runner, source ``return``);
   2. a reward plugin's answer (a number, or the ``reward`` key of a dict);
   3. the last reward named ``reward`` emitted during the run (``agl.emit_reward``);
   4. for a failed or timed-out rollout, ``failed_reward`` (None drops it);
      for a succeeded one, ``missing_reward`` (None drops it, counted).

   Every other emitted reward is an intermediate reward, placed after the last
   call made before it (by time), for the ``emitted`` credit strategy.

3. **assigns credit** with the strategy named in the config, resolved through the
   plugin registry, over every call of the rollout in order (all agents), then
   keeps only the calls of the selected agents (``agents``; None keeps all), and
   sets ``weight = 1 / (calls kept in the rollout)`` when ``normalize="rollout"``
   so a rollout with many calls does not outweigh one with few in its group.

Records of an earlier attempt of a retried rollout (made before the last attempt
started) are left out and counted; they stay in the store.

On the embedded SQLite store the builder reads only the columns it needs with
SQL (token blobs unpacked straight into arrays, JSON fields extracted by SQLite);
on any other store it goes through the public :class:`~agl.store.Store` queries,
batched by rollout chunks. Either way it streams: one chunk of rollouts at a time.
"""

from __future__ import annotations

import json
import logging
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agl.credit import RolloutRewards
from agl.schema import Reward, Rollout, RolloutStatus, Task, Transition
from agl.store.base import Store

log = logging.getLogger(__name__)

_SWAP = sys.byteorder != "little"

CHUNK = 200
"""Rollouts read from the store per round trip."""

RETURN_SOURCE = "return"
"""The source of a reward the agent function returned (written by the runner)."""


class TransitionConfig(BaseModel):
    """How rollouts become transitions."""

    model_config = ConfigDict(extra="forbid")

    credit: str = Field(default="broadcast", description="credit-assignment strategy (see agl.credit)")
    credit_options: dict[str, float] = Field(default_factory=dict, description="e.g. {'gamma': 0.9}")
    normalize: Literal["rollout", "none"] = Field(
        default="rollout", description="'rollout': weight = 1/calls kept per rollout; 'none': weight 1"
    )
    agents: list[str] | None = Field(default=None, description="train only these agents' calls (None: all)")
    failed_reward: float | None = Field(
        default=0.0, description="final reward of a failed/timed-out rollout with none of its own; None drops it"
    )
    missing_reward: float | None = Field(
        default=None, description="final reward of a succeeded rollout nobody rewarded; None drops it (counted)"
    )
    text_only: bool = Field(default=True, description="emit text-only transitions (spans with no gateway record)")
    with_text: bool = Field(default=False, description="fill prompt_messages/response_text on engine transitions too")
    reward_plugins: bool = Field(default=True, description="run agl_reward plugins")


@dataclass
class BuildReport:
    """What a build did, for logs and metrics. Nothing is dropped without a count here."""

    rollouts: int = 0
    transitions: int = 0
    joined_by_id: int = 0
    joined_by_order: int = 0
    unmatched_spans: int = 0
    text_only: int = 0
    gateway_only: int = 0
    filtered_out: int = 0
    stale_records: int = 0
    plugin_errors: int = 0
    dropped_rollouts: dict[str, int] = field(default_factory=dict)
    unmatched: list[tuple[str, str]] = field(default_factory=list)
    """``(rollout_id, span_id)`` of unmatched spans (the first 100)."""

    def drop(self, reason: str) -> None:
        self.dropped_rollouts[reason] = self.dropped_rollouts.get(reason, 0) + 1

    def as_metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.__dict__.items() if isinstance(v, int)}
        for reason, n in self.dropped_rollouts.items():
            out[f"dropped_{reason}"] = float(n)
        return out


# -- the records the join works on ------------------------------------------------------


@dataclass(slots=True)
class _Call:
    call_id: str
    seq: int
    time: float
    model_version: str | None
    prompt_ids: array
    response_ids: array
    logprobs: array | None
    request: dict | None = None  # decoded only when needed
    response: dict | None = None


@dataclass(slots=True)
class _LlmSpan:
    span_id: str
    seq: int
    time: float
    response_id: str | None
    agent: str | None
    input_messages: Any = None  # decoded only when needed
    output_messages: Any = None
    loaded: bool = False


@dataclass(slots=True)
class _Step:
    time: float
    call: _Call | None
    span: _LlmSpan | None

    @property
    def agent(self) -> str | None:
        return None if self.span is None else self.span.agent


@dataclass(slots=True)
class _Reward:
    """The fields of a stored reward the build reads (duck-types :class:`~agl.schema.Reward`)."""

    reward_id: str
    name: str
    value: float
    source: str
    created_at: float


@dataclass
class _Chunk:
    calls: dict[str, list[_Call]]
    spans: dict[str, list[_LlmSpan]]
    rewards: dict[str, list[Reward | _Reward]]


# -- readers ------------------------------------------------------------------------------


class _GenericReader:
    """Reads through the public Store API (any backend: HTTP, PostgreSQL, …)."""

    def __init__(self, store: Store, need_text: bool):
        self.store = store
        self.need_text = need_text

    def read(self, rollout_ids: list[str]) -> _Chunk:
        chunk = _Chunk({}, {}, {})
        for c in self.store.query_llm_calls(rollout_ids=rollout_ids):
            chunk.calls.setdefault(c.rollout_id, []).append(
                _Call(c.call_id, c.seq, c.created_at, c.model_version, c.prompt_ids, c.response_ids,
                      c.response_logprobs, c.request, c.response)
            )
        for s in self.store.query_spans(rollout_ids=rollout_ids, kind="llm"):
            a = s.attributes
            chunk.spans.setdefault(s.rollout_id, []).append(
                _LlmSpan(s.span_id, s.seq, s.end_time or s.start_time, _opt_str(a.get("gen_ai.response.id")),
                         _opt_str(a.get("gen_ai.agent.name")), _json_attr(a.get("gen_ai.input.messages")),
                         _json_attr(a.get("gen_ai.output.messages")), True)
            )
        for r in self.store.query_rewards(rollout_ids=rollout_ids):
            chunk.rewards.setdefault(r.rollout_id, []).append(r)
        return chunk

    def load_span(self, span: _LlmSpan) -> None:  # already loaded
        return None

    def load_calls(self, calls: list[_Call]) -> None:
        return None

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        out = {}
        for tid in task_ids:
            try:
                out[tid] = self.store.get_task(tid)
            except KeyError:
                pass
        return out


class _SqliteReader:
    """Reads the embedded SQLite store's tables directly: only the needed columns, no JSON in Python.

    Uses the SQL store's one-statement read helper (``_read``), which is part of
    the same package; every other store goes through :class:`_GenericReader`.
    """

    def __init__(self, store: Any):
        self.store = store

    def _q(self, sql: str, params: Sequence[Any]) -> list:
        return self.store._read(sql, params)

    @staticmethod
    def _marks(n: int) -> str:
        return ", ".join("?" for _ in range(n))

    def read(self, rollout_ids: list[str]) -> _Chunk:
        m = self._marks(len(rollout_ids))
        chunk = _Chunk({}, {}, {})
        rows = self._q(
            "SELECT rollout_id, call_id, json_extract(body, '$.seq'), json_extract(body, '$.created_at'), "
            "json_extract(body, '$.model_version'), prompt_ids, response_ids, response_logprobs "
            f"FROM llm_calls WHERE rollout_id IN ({m}) ORDER BY pk",
            rollout_ids,
        )
        calls = chunk.calls
        for rid, cid, seq, t, mv, p, r, lp in rows:
            pa = array("i")
            pa.frombytes(p)
            ra = array("i")
            ra.frombytes(r)
            if lp is None:
                la = None
            else:
                la = array("f")
                la.frombytes(lp)
            entry = _Call(cid, seq or 0, t or 0.0, mv, pa, ra, la)
            bucket = calls.get(rid)
            if bucket is None:
                calls[rid] = [entry]
            else:
                bucket.append(entry)
        if _SWAP:  # token blobs are little-endian; swap on a big-endian host
            for bucket in calls.values():
                for c in bucket:
                    for values in (c.prompt_ids, c.response_ids, c.logprobs):
                        if values is not None:
                            values.byteswap()
        rows = self._q(
            "SELECT rollout_id, span_id, json_extract(body, '$.seq'), start_time, json_extract(body, '$.end_time'), "
            "json_extract(body, '$.attributes.\"gen_ai.response.id\"'), "
            "json_extract(body, '$.attributes.\"gen_ai.agent.name\"') "
            f"FROM spans WHERE kind = 'llm' AND rollout_id IN ({m}) ORDER BY pk",
            rollout_ids,
        )
        for rid, sid, seq, start, end, resp_id, agent in rows:
            chunk.spans.setdefault(rid, []).append(
                _LlmSpan(sid, seq or 0, end or start, _opt_str(resp_id), _opt_str(agent))
            )
        rows = self._q(
            "SELECT rollout_id, reward_id, json_extract(body, '$.name'), json_extract(body, '$.value'), "
            "json_extract(body, '$.source'), json_extract(body, '$.created_at') "
            f"FROM rewards WHERE rollout_id IN ({m}) ORDER BY pk",
            rollout_ids,
        )
        for rid, wid, name, value, source, t in rows:
            chunk.rewards.setdefault(rid, []).append(_Reward(wid, name, float(value), source, t or 0.0))
        return chunk

    def load_span(self, span: _LlmSpan) -> None:
        if span.loaded:
            return
        rows = self._q(
            "SELECT json_extract(body, '$.attributes.\"gen_ai.input.messages\"'), "
            "json_extract(body, '$.attributes.\"gen_ai.output.messages\"') FROM spans WHERE span_id = ?",
            [span.span_id],
        )
        if rows:
            span.input_messages = _json_attr(rows[0][0])
            span.output_messages = _json_attr(rows[0][1])
        span.loaded = True

    def load_calls(self, calls: list[_Call]) -> None:
        todo = [c for c in calls if c.request is None]
        if not todo:
            return
        by_id = {c.call_id: c for c in todo}
        for i in range(0, len(todo), 500):
            ids = [c.call_id for c in todo[i : i + 500]]
            sql = f"SELECT call_id, json_extract(body, '$.request'), json_extract(body, '$.response') FROM llm_calls WHERE call_id IN ({self._marks(len(ids))})"
            for cid, req, resp in self._q(sql, ids):
                by_id[cid].request = json.loads(req) if req else {}
                by_id[cid].response = json.loads(resp) if resp else {}

    def tasks(self, task_ids: list[str]) -> dict[str, Task]:
        out = {}
        for i in range(0, len(task_ids), 500):
            ids = task_ids[i : i + 500]
            for (body,) in self._q(f"SELECT body FROM tasks WHERE task_id IN ({self._marks(len(ids))})", ids):
                task = Task.model_validate_json(body)
                out[task.task_id] = task
        return out


def _reader_for(store: Store, need_text: bool) -> _GenericReader | _SqliteReader:
    dialect = getattr(store, "dialect", None)
    if getattr(dialect, "name", None) == "sqlite" and hasattr(store, "_read"):
        return _SqliteReader(store)
    return _GenericReader(store, need_text)


# -- message helpers ---------------------------------------------------------------------

_ROLE_ALIASES = {"human": "user", "ai": "assistant", "AIMessage": "assistant", "HumanMessage": "user",
                 "SystemMessage": "system", "developer": "system", "model": "assistant"}


def _opt_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _json_attr(value: Any) -> Any:
    """An attribute holding JSON: OpenTelemetry exporters store structured values as JSON strings."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("content"))
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    if isinstance(content, dict):
        return _content_text(content.get("text", content.get("content")))
    return str(content)


def normalize_messages(messages: Any) -> list[tuple[str, str]]:
    """Chat messages in any common shape as ``(role, text)`` pairs, for comparing a span with a call.

    Accepts OpenAI chat messages (``content`` a string or a list of parts), OpenTelemetry
    GenAI messages (``parts`` with ``content``), LangChain dumps (``type`` human/ai) and
    Responses API input (a string, or items with ``role`` and ``content``). Items with
    no role (tool outputs, reasoning items of the Responses API) keep their type as role.
    """
    if messages is None:
        return []
    if isinstance(messages, str):
        return [("user", messages.strip())]
    out = []
    for m in messages:
        if isinstance(m, str):
            out.append(("user", m.strip()))
            continue
        if not isinstance(m, dict):
            continue
        role = m.get("role") or m.get("type") or ""
        role = _ROLE_ALIASES.get(role, role)
        if "parts" in m and "content" not in m:
            text = _content_text(m["parts"])
        else:
            text = _content_text(m.get("content"))
        out.append((role, text.strip()))
    return out


def request_messages(request: dict) -> Any:
    """The prompt of a gateway request: chat ``messages``, or the Responses API's ``instructions`` + ``input``."""
    if "messages" in request:
        return request["messages"]
    if "input" in request:
        items = request["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items)
        if request.get("instructions"):
            items = [{"role": "system", "content": request["instructions"]}, *items]
        return items
    if "prompt" in request and isinstance(request["prompt"], str):
        return [{"role": "user", "content": request["prompt"]}]
    return None


def response_text(response: dict) -> str | None:
    """The text of a gateway response (chat completion, completion or Responses API)."""
    choices = response.get("choices")
    if choices:
        first = choices[0]
        if "message" in first:
            return _content_text(first["message"].get("content"))
        if "text" in first:
            return first["text"]
    if isinstance(response.get("output_text"), str):
        return response["output_text"]
    if isinstance(response.get("output"), list):
        return "".join(_content_text(item.get("content")) for item in response["output"] if isinstance(item, dict))
    return None


def _messages_list(messages: Any) -> list[dict] | None:
    if messages is None:
        return None
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [m if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in messages]


def _output_text(messages: Any) -> str | None:
    if messages is None:
        return None
    if isinstance(messages, str):
        return messages
    pairs = normalize_messages(messages)
    return "".join(text for role, text in pairs if role in ("assistant", "")) or (pairs[-1][1] if pairs else None)


# -- rewards ----------------------------------------------------------------------------


def _plugin_rewards(rollout: Rollout, store: Store, report: BuildReport, impls: list[tuple[str, Any]]) -> list[Reward]:
    """Run every ``agl_reward`` implementation (``(plugin name, hookimpl)``); return what they gave as Reward rows."""
    out: list[Reward] = []
    lazy: dict[str, Any] = {}
    for source, impl in impls:
        kwargs: dict[str, Any] = {}
        for name in impl.argnames:
            if name == "rollout":
                kwargs[name] = rollout
            elif name not in lazy:
                if name == "spans":
                    lazy[name] = list(store.query_spans(rollout_id=rollout.rollout_id))
                elif name == "llm_calls":
                    lazy[name] = list(store.query_llm_calls(rollout_id=rollout.rollout_id))
                elif name == "rewards":
                    lazy[name] = list(store.query_rewards(rollout_id=rollout.rollout_id))
            if name != "rollout":
                kwargs[name] = lazy[name]
        try:
            answer = impl.function(**kwargs)
        except Exception as exc:
            report.plugin_errors += 1
            log.warning("reward plugin %s failed on rollout %s: %s: %s", source, rollout.rollout_id, type(exc).__name__, exc)
            continue
        if answer is None:
            continue
        named = answer if isinstance(answer, dict) else {"reward": answer}
        for name, value in named.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                report.plugin_errors += 1
                log.warning("reward plugin %s: reward %r of rollout %s is not a number: %r", source, name, rollout.rollout_id, value)
                continue
            out.append(
                Reward(
                    reward_id=f"rw-{rollout.rollout_id}-a{rollout.attempt}-{source}-{name}",
                    rollout_id=rollout.rollout_id, name=name, value=value, source=source,
                )
            )
    return out


def final_reward(rewards: Sequence[Reward], plugin_sources: set[str]) -> tuple[float | None, Reward | None]:
    """The final reward by precedence: returned > plugin > last emitted ``reward``. Returns (value, the reward)."""
    returned = plugin = emitted = None
    for r in rewards:
        if r.name != "reward":
            continue
        if r.source == RETURN_SOURCE:
            returned = r
        elif r.source in plugin_sources:
            plugin = plugin or r  # the first plugin in call order wins
        else:
            emitted = r
    chosen = returned or plugin or emitted
    return (None, None) if chosen is None else (chosen.value, chosen)


# -- the builder ------------------------------------------------------------------------

_FIELDS = frozenset(Transition.model_fields)
_FIELDS_SET = set(_FIELDS)
_new = object.__new__
_set = object.__setattr__


def _make_transition(values: dict[str, Any]) -> Transition:
    """A Transition from values the builder has already checked, without validation.

    What ``Transition.model_construct`` does with every field given, minus its
    per-field bookkeeping (about 10 µs a call, a third of a build); checked against
    ``model_construct`` when this module is imported.
    """
    obj = _new(Transition)
    _set(obj, "__dict__", values)
    # Every field is set, so one shared set is what each instance would hold (pydantic only ever adds to it).
    _set(obj, "__pydantic_fields_set__", _FIELDS_SET)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def _check_make_transition() -> None:
    values = dict(rollout_id="r", task_id="t", step=0, agent=None, prompt_ids=array("i", [1]), response_ids=array("i"),
                  response_logprobs=None, reward=1.0, model_version=None, token_source="engine", call_id=None,
                  weight=1.0, prompt_messages=None, response_text=None)
    if set(values) != _FIELDS or _make_transition(dict(values)) != Transition.model_construct(**values):
        raise RuntimeError("agl.transitions: Transition's fields changed; update _make_transition")


_check_make_transition()


class TransitionBuilder:
    """Turns ended rollouts into transitions (see the module docstring for the rules)."""

    def __init__(self, store: Store, config: TransitionConfig | None = None):
        from agl.plugins import get_plugin_manager, resolve

        self.store = store
        self.config = config or TransitionConfig()
        self.strategy = resolve("credit_assignment", self.config.credit)
        self.report = BuildReport()
        self.finals: dict[str, float] = {}
        """Each built rollout's final reward (after precedence and the failed/missing defaults)."""
        self._agents = None if self.config.agents is None else frozenset(self.config.agents)
        self._reader = _reader_for(store, self.config.with_text)
        pm = get_plugin_manager()
        impls = pm.hook.agl_reward.get_hookimpls() if self.config.reward_plugins else []
        self._impls = [(pm.get_name(i.plugin) or i.plugin_name, i) for i in impls]
        self._has_plugins = bool(impls)
        self._plugin_names = frozenset(name for name, _ in self._impls)

    def build(self, rollouts: Iterable[Rollout]) -> list[Transition]:
        """All transitions of these rollouts, as a list."""
        return list(self.iter(rollouts))

    def iter(self, rollouts: Iterable[Rollout]) -> Iterator[Transition]:
        """Stream the transitions of these rollouts, one chunk of rollouts at a time.

        The next chunk is read from the store on a helper thread while this one is
        processed (the database releases the GIL while it reads).
        """
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agl-transitions") as pool:
            pending = None
            for live in self._live_chunks(rollouts):
                ahead = (live, pool.submit(self._reader.read, [r.rollout_id for r in live]))
                if pending is not None:
                    yield from self._chunk(pending[0], pending[1].result())
                pending = ahead
            if pending is not None:
                yield from self._chunk(pending[0], pending[1].result())
        if self.report.unmatched_spans:
            log.warning(
                "%d LLM span(s) could not be matched to a gateway record and were left out, e.g. %s",
                self.report.unmatched_spans, ", ".join(f"{r}/{s}" for r, s in self.report.unmatched[:5]),
            )

    def _live_chunks(self, rollouts: Iterable[Rollout]) -> Iterator[list[Rollout]]:
        """Ended rollouts in chunks of ``CHUNK``; the others are counted and left out."""
        report = self.report
        live: list[Rollout] = []
        for r in rollouts:
            if r.status == RolloutStatus.CANCELLED:
                report.drop("cancelled")
            elif not r.status.terminal:
                report.drop("not_ended")
            else:
                live.append(r)
                if len(live) >= CHUNK:
                    yield live
                    live = []
        if live:
            yield live

    def _chunk(self, live: list[Rollout], chunk: _Chunk) -> Iterator[Transition]:
        report = self.report
        plugin_rewards: dict[str, list[Reward]] = {}
        if self._has_plugins:
            missing = sorted({r.task_id for r in live if r.task is None})
            tasks = self._reader.tasks(missing) if missing else {}
            new: list[Reward] = []
            for r in live:
                if r.task is None and r.task_id in tasks:
                    r = r.model_copy(update={"task": tasks[r.task_id]})
                got = _plugin_rewards(r, self.store, report, self._impls)
                plugin_rewards[r.rollout_id] = got
                stored = {w.reward_id for w in chunk.rewards.get(r.rollout_id, ())}
                new.extend(w for w in got if w.reward_id not in stored)
            if new:
                self.store.add_rewards(new)
        for r in live:
            report.rollouts += 1
            yield from self._rollout(r, chunk, plugin_rewards.get(r.rollout_id, []))

    def _rollout(self, rollout: Rollout, chunk: _Chunk, plugin: list[Reward]) -> Iterator[Transition]:
        cfg, report = self.config, self.report
        rid = rollout.rollout_id
        calls = chunk.calls.get(rid, [])
        spans = chunk.spans.get(rid, [])
        rewards = chunk.rewards.get(rid, [])
        if self._plugin_names:
            rewards = [w for w in rewards if w.source not in self._plugin_names]  # recomputed below
        if rollout.attempt > 1 and rollout.started_at is not None:
            start = rollout.started_at
            n = len(calls) + len(spans) + len(rewards)
            calls = [c for c in calls if c.time >= start]
            spans = [s for s in spans if s.time >= start]
            rewards = [w for w in rewards if w.created_at >= start]
            report.stale_records += n - len(calls) - len(spans) - len(rewards)

        steps = self._join(rid, calls, spans)

        value, chosen = final_reward([*rewards, *plugin], self._plugin_names)
        if value is None:
            if rollout.status == RolloutStatus.SUCCEEDED:
                value = cfg.missing_reward
                reason = "no_reward"
            else:
                value = cfg.failed_reward
                reason = rollout.status.value
            if value is None:
                report.drop(reason)
                return
        self.finals[rid] = value
        intermediate = []
        if rewards:
            times = [s.time for s in steps]
            for w in rewards:
                if w is not chosen and w.source != RETURN_SOURCE:
                    intermediate.append((_index_before(times, w.created_at), w.value))
        if not steps:
            report.drop("no_calls")
            return
        per_call = self.strategy(len(steps), RolloutRewards(final=value, emitted=intermediate), **cfg.credit_options)
        if len(per_call) != len(steps):
            raise ValueError(
                f"credit: strategy {cfg.credit!r} returned {len(per_call)} rewards for {len(steps)} calls of rollout {rid}"
            )

        kept = [(i, s) for i, s in enumerate(steps) if self._agents is None or s.agent in self._agents]
        report.filtered_out += len(steps) - len(kept)
        if not cfg.text_only:
            kept = [(i, s) for i, s in kept if s.call is not None]
        if not kept:
            return
        if cfg.with_text:
            self._reader.load_calls([s.call for _, s in kept if s.call is not None])
            for _, s in kept:
                if s.span is not None:
                    self._reader.load_span(s.span)
        weight = 1.0 / len(kept) if cfg.normalize == "rollout" else 1.0
        task_id = rollout.task_id
        fallback_version = rollout.model_version
        construct = _make_transition
        for i, s in kept:
            c = s.call
            if c is not None:
                t = construct({
                    "rollout_id": rid, "task_id": task_id, "step": i, "agent": s.agent, "prompt_ids": c.prompt_ids,
                    "response_ids": c.response_ids, "response_logprobs": c.logprobs, "reward": float(per_call[i]),
                    "model_version": c.model_version or fallback_version, "token_source": "engine",
                    "call_id": c.call_id, "weight": weight, "prompt_messages": None, "response_text": None,
                })
                if cfg.with_text:
                    t.prompt_messages = _messages_list(request_messages(c.request or {}))
                    t.response_text = response_text(c.response or {})
            else:
                sp = s.span
                self._reader.load_span(sp)
                t = construct({
                    "rollout_id": rid, "task_id": task_id, "step": i, "agent": s.agent, "prompt_ids": array("i"),
                    "response_ids": array("i"), "response_logprobs": None, "reward": float(per_call[i]),
                    "model_version": fallback_version, "token_source": "text", "call_id": sp.response_id,
                    "weight": weight, "prompt_messages": _messages_list(sp.input_messages),
                    "response_text": _output_text(sp.output_messages),
                })
            report.transitions += 1
            yield t

    def _join(self, rid: str, calls: list[_Call], spans: list[_LlmSpan]) -> list[_Step]:
        report = self.report
        if len(calls) > 1:
            calls.sort(key=lambda c: c.seq)
        if not spans:
            report.gateway_only += len(calls)
            return [_Step(c.time, c, None) for c in calls]
        if len(spans) == len(calls):
            # The common case: every call has its span, joined by response id; the gateway's order stands.
            span_of = {sp.response_id: sp for sp in spans}
            if len(span_of) == len(calls) and all(c.call_id in span_of for c in calls):
                report.joined_by_id += len(calls)
                return [_Step(c.time, c, span_of[c.call_id]) for c in calls]
        spans.sort(key=lambda s: s.seq)
        by_id = {c.call_id: c for c in calls}
        taken: set[str] = set()
        steps: list[_Step] = []
        orphans: list[_LlmSpan] = []
        for sp in spans:
            if sp.response_id is None:
                orphans.append(sp)
                continue
            c = by_id.get(sp.response_id)
            if c is None or c.call_id in taken:
                report.text_only += 1
                steps.append(_Step(sp.time, None, sp))
            else:
                taken.add(c.call_id)
                report.joined_by_id += 1
                steps.append(_Step(c.time, c, sp))
        if orphans:
            left = [c for c in calls if c.call_id not in taken]
            if not left:
                for sp in orphans:
                    report.text_only += 1
                    steps.append(_Step(sp.time, None, sp))
            else:
                self._reader.load_calls(left)
                pos = 0
                for sp in orphans:
                    self._reader.load_span(sp)
                    want = normalize_messages(sp.input_messages)
                    match = None
                    if want:
                        for j in range(pos, len(left)):
                            if normalize_messages(request_messages(left[j].request or {})) == want:
                                match = j
                                break
                    if match is None:
                        report.unmatched_spans += 1
                        if len(report.unmatched) < 100:
                            report.unmatched.append((rid, sp.span_id))
                        continue
                    c = left[match]
                    pos = match + 1
                    taken.add(c.call_id)
                    report.joined_by_order += 1
                    steps.append(_Step(c.time, c, sp))
        for c in calls:
            if c.call_id not in taken:
                report.gateway_only += 1
                steps.append(_Step(c.time, c, None))
        if any(steps[k].time > steps[k + 1].time for k in range(len(steps) - 1)):
            steps.sort(key=lambda s: (s.time, s.call.seq if s.call else 0))
        return steps


def _index_before(times: list[float], t: float) -> int:
    """Index of the last call made at or before ``t`` (-1: before any)."""
    index = -1
    for i, ct in enumerate(times):
        if ct <= t:
            index = i
        else:
            break
    return index


def build_transitions(
    store: Store, rollouts: Iterable[Rollout], config: TransitionConfig | None = None
) -> tuple[list[Transition], BuildReport]:
    """Build the transitions of ``rollouts`` from ``store``; return them with the build's report."""
    builder = TransitionBuilder(store, config)
    transitions = builder.build(rollouts)
    return transitions, builder.report


__all__ = [
    "BuildReport",
    "TransitionBuilder",
    "TransitionConfig",
    "build_transitions",
    "final_reward",
    "normalize_messages",
    "request_messages",
    "response_text",
]
