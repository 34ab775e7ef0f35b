"""The builder: reads chunks of ended rollouts, joins their spans and calls, rewards them and assigns credit."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import Any

from agl.schema import RETURN_SOURCE, Reward, Rollout, RolloutStatus, Task, Transition
from agl.store.base import Store
from agl_trainer.credit import RolloutRewards
from agl_trainer.transitions.config import BuildReport, TransitionConfig
from agl_trainer.transitions.messages import (
    _messages_list,
    _output_text,
    normalize_messages,
    request_messages,
    response_text,
)
from agl_trainer.transitions.readers import _GenericReader, _SqlReader
from agl_trainer.transitions.records import _Call, _Chunk, _LlmSpan, _Step, _step
from agl_trainer.transitions.rewards import _index_before, _plugin_rewards, _with_task, final_reward

log = logging.getLogger("agl_trainer.transitions")

CHUNK = 200
"""Rollouts read from the store per round trip."""


def _pick_reader(store: Store, need_text: bool) -> _GenericReader | _SqlReader:
    """The reader for ``store``: :func:`agl_trainer.transitions.readers._reader_for`, looked up on the package.

    Looked up when a builder is made rather than imported, so that replacing
    ``agl_trainer.transitions._reader_for`` takes effect: the tests and the benchmark force
    the generic reader that way.
    """
    from agl_trainer import transitions

    return transitions._reader_for(store, need_text)


_by_seq = attrgetter("seq")
_Joined = tuple[list[Any], list[Any], list[Any], "list[float] | None"]
_NO_REWARDS: list[Reward] = []

_TEMPLATE = Transition(
    rollout_id="-",
    task_id="-",
    step=0,
    agent=None,
    prompt_ids=[],
    response_ids=[],
    response_logprobs=None,
    reward=0.0,
    model_version=None,
    token_source="engine",
    call_id=None,
    weight=1.0,
    prompt_messages=None,
    response_text=None,
)
"""A validated transition with every field set; each built one is a ``model_copy`` of it.

``model_copy(update=...)`` does not validate, and the builder checked its values
already; it costs a third of ``model_construct`` (which re-walks every field's
defaults and aliases), a build's largest single cost otherwise.
"""
_copy_template = _TEMPLATE.model_copy


class TransitionBuilder:
    """Turns ended rollouts into transitions (see :mod:`agl_trainer.transitions` for the rules)."""

    def __init__(self, store: Store, config: TransitionConfig | None = None):
        from agl.plugins import get_plugin_manager, resolve

        self.store = store
        self.config = config or TransitionConfig()
        self.strategy = resolve("credit_assignment", self.config.credit)
        self.report = BuildReport()
        self.finals: dict[str, float] = {}
        """Each built rollout's final reward (after precedence and the failed/missing defaults)."""
        self._agents = None if self.config.agents is None else frozenset(self.config.agents)
        self._reader = _pick_reader(store, self.config.with_text)
        pm = get_plugin_manager()
        self._reward_hook = pm.hook.agl_reward
        impls = self._reward_hook.get_hookimpls() if self.config.reward_plugins else []
        self._has_plugins = bool(impls)
        self._plugin_names = frozenset(i.plugin_name for i in impls)
        """The plugins answering ``agl_reward``: their stored rows are recomputed, not read back."""
        self._tasks: dict[str, Task] = {}
        """Tasks read for reward plugins, kept for the builder's later chunks (a task does not change)."""

    def build(self, rollouts: Iterable[Rollout]) -> list[Transition]:
        """All transitions of these rollouts, as a list."""
        out: list[Transition] = []
        for part in self._parts(rollouts):
            out.extend(part)
        return out

    def iter(self, rollouts: Iterable[Rollout]) -> Iterator[Transition]:
        """Stream the transitions of these rollouts, one chunk of rollouts at a time.

        The next chunk is read from the store on a helper thread while this one is
        processed (the database releases the GIL while it reads).
        """
        for part in self._parts(rollouts):
            yield from part

    def _parts(self, rollouts: Iterable[Rollout]) -> Iterator[list[Transition]]:
        """The transitions of each chunk of rollouts, a list per chunk (what :meth:`iter` streams)."""
        from concurrent.futures import ThreadPoolExecutor

        reader = self._reader
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agl-transitions") as pool:
            pending = None
            for live in self._live_chunks(rollouts):
                ahead = (live, pool.submit(reader.fetch, [r.rollout_id for r in live]))
                if pending is not None:
                    yield self._chunk(pending[0], reader.convert(pending[1].result()))
                pending = ahead
            if pending is not None:
                yield self._chunk(pending[0], reader.convert(pending[1].result()))
        if self.report.unmatched_spans:
            log.warning(
                "%d LLM span(s) could not be matched to a gateway record and were left out, e.g. %s",
                self.report.unmatched_spans,
                ", ".join(f"{r}/{s}" for r, s in self.report.unmatched[:5]),
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

    def _chunk(self, live: list[Rollout], chunk: _Chunk) -> list[Transition]:
        report = self.report
        plugin_rewards: dict[str, list[Reward]] = {}
        if self._has_plugins:
            tasks = self._tasks
            missing = sorted({r.task_id for r in live if r.task is None and r.task_id not in tasks})
            if missing:
                tasks.update(self._reader.tasks(missing))
            store, call, stored_rewards = self.store, self._reward_hook, chunk.rewards
            new: list[Reward] = []
            for r in live:
                if r.task is None:
                    task = tasks.get(r.task_id)
                    if task is not None:
                        r = _with_task(r, task)
                got = _plugin_rewards(r, store, report, call)
                plugin_rewards[r.rollout_id] = got
                if got:
                    have = stored_rewards.get(r.rollout_id)
                    if have:
                        stored = {w.reward_id for w in have}
                        new.extend(w for w in got if w.reward_id not in stored)
                    else:
                        new.extend(got)
            if new:
                self.store.add_rewards(new)
        out: list[Transition] = []
        for r in live:
            report.rollouts += 1
            self._rollout(r, chunk, plugin_rewards.get(r.rollout_id, _NO_REWARDS), out)
        return out

    def _drop_aborted(self, calls: list[_Call]) -> list[_Call]:
        """``calls`` without the aborted ones (recorded with no response ids), counted in the report."""
        kept = [c for c in calls if len(c.response_ids)]
        self.report.aborted_calls += len(calls) - len(kept)
        return kept

    def _rollout(self, rollout: Rollout, chunk: _Chunk, plugin: list[Reward], out: list[Transition]) -> None:
        """Append the transitions of one rollout to ``out``."""
        cfg, report = self.config, self.report
        rid = rollout.rollout_id
        calls = chunk.calls.get(rid, [])
        spans = chunk.spans.get(rid, [])
        rewards = chunk.rewards.get(rid, [])
        plugin_names = self._plugin_names
        if plugin_names and rewards:
            rewards = [w for w in rewards if w.source not in plugin_names]  # recomputed below
        if rollout.attempt > 1 and rollout.started_at is not None:
            start = rollout.started_at
            n = len(calls) + len(spans) + len(rewards)
            calls = [c for c in calls if c.time >= start]
            spans = [s for s in spans if s.time >= start]
            rewards = [w for w in rewards if w.created_at >= start]
            report.stale_records += n - len(calls) - len(spans) - len(rewards)
        if calls:
            calls = self._drop_aborted(calls)

        # The joined steps in order, as parallel lists: the gateway record (None: text-only),
        # the span (None: gateway-only), the agent and the time of each.
        step_calls, step_spans, step_agents, times = self._join(rid, calls, spans)

        value, chosen = final_reward([*rewards, *plugin] if plugin else rewards, plugin_names)
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
            if times is None:
                times = [c.time for c in step_calls]
            for w in rewards:
                if w is not chosen and w.source != RETURN_SOURCE:
                    intermediate.append((_index_before(times, w.created_at), w.value))
        n_steps = len(step_calls)
        if not n_steps:
            report.drop("no_calls")
            return
        per_call = self.strategy(n_steps, RolloutRewards(final=value, emitted=intermediate), **cfg.credit_options)
        if len(per_call) != n_steps:
            raise ValueError(
                f"credit: strategy {cfg.credit!r} returned {len(per_call)} rewards for {n_steps} calls of rollout {rid}"
            )

        agents = self._agents
        if agents is None:
            kept = range(n_steps)
        else:
            kept = [i for i, a in enumerate(step_agents) if a in agents]
            report.filtered_out += n_steps - len(kept)
        if not cfg.text_only:
            kept = [i for i in kept if step_calls[i] is not None]
        if not kept:
            return
        with_text = cfg.with_text
        if with_text:
            self._reader.load_calls([step_calls[i] for i in kept if step_calls[i] is not None])
            for i in kept:
                if step_spans[i] is not None:
                    self._reader.load_span(step_spans[i])
        weight = 1.0 / len(kept) if cfg.normalize == "rollout" else 1.0
        task_id = rollout.task_id
        fallback_version = rollout.model_version
        make = _copy_template
        append = out.append
        for i in kept:
            c = step_calls[i]
            if c is not None:
                t = make(
                    update={
                        "rollout_id": rid,
                        "task_id": task_id,
                        "step": i,
                        "agent": step_agents[i],
                        "prompt_ids": c.prompt_ids,
                        "response_ids": c.response_ids,
                        "response_logprobs": c.logprobs,
                        "reward": float(per_call[i]),
                        "model_version": c.model_version or fallback_version,
                        "call_id": c.call_id,
                        "weight": weight,
                    }
                )
                if with_text:
                    t.prompt_messages = _messages_list(request_messages(c.request or {}))
                    t.response_text = response_text(c.response or {})
            else:
                sp = step_spans[i]
                self._reader.load_span(sp)
                t = make(
                    update={
                        "rollout_id": rid,
                        "task_id": task_id,
                        "step": i,
                        "agent": step_agents[i],
                        "prompt_ids": array("i"),
                        "response_ids": array("i"),
                        "response_logprobs": None,
                        "reward": float(per_call[i]),
                        "model_version": fallback_version,
                        "token_source": "text",
                        "call_id": sp.response_id,
                        "weight": weight,
                        "prompt_messages": _messages_list(sp.input_messages),
                        "response_text": _output_text(sp.output_messages),
                    }
                )
            append(t)
        report.transitions += len(kept)

    def _join(self, rid: str, calls: list[_Call], spans: list[_LlmSpan]) -> _Joined:
        """The rollout's steps in order as parallel lists: ``(calls, spans, agents, times)``.

        ``times`` is None where the steps are the calls (their times are the calls' own).
        """
        report = self.report
        if len(calls) > 1:
            calls.sort(key=_by_seq)
        if not spans:
            report.gateway_only += len(calls)
            return calls, [None] * len(calls), [None] * len(calls), None
        if len(spans) == len(calls):
            # The common case: every call has its span, joined by response id; the gateway's order stands.
            span_of = {sp.response_id: sp for sp in spans}
            if len(span_of) == len(calls):
                get = span_of.get
                matched = [get(c.call_id) for c in calls]
                if all(matched):  # every call has its span (a record is always true; None is not)
                    report.joined_by_id += len(calls)
                    return calls, matched, [sp.agent for sp in matched], None
        steps = self._join_steps(rid, calls, spans)
        return [s.call for s in steps], [s.span for s in steps], [s.agent for s in steps], [s.time for s in steps]

    def _join_steps(self, rid: str, calls: list[_Call], spans: list[_LlmSpan]) -> list[_Step]:
        """The general join (some span has no response id, or one the gateway never issued); ``calls`` sorted."""
        report = self.report
        spans.sort(key=_by_seq)
        by_id = {c.call_id: c for c in calls}
        taken: set[str] = set()
        steps = []
        orphans: list[_LlmSpan] = []
        for sp in spans:
            if sp.response_id is None:
                orphans.append(sp)
                continue
            c = by_id.get(sp.response_id)
            if c is None or c.call_id in taken:
                report.text_only += 1
                steps.append(_step(sp.time, None, sp))
            else:
                taken.add(c.call_id)
                report.joined_by_id += 1
                steps.append(_step(c.time, c, sp))
        if orphans:
            left = [c for c in calls if c.call_id not in taken]
            if not left:
                for sp in orphans:
                    report.text_only += 1
                    steps.append(_step(sp.time, None, sp))
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
                    steps.append(_step(c.time, c, sp))
        for c in calls:
            if c.call_id not in taken:
                report.gateway_only += 1
                steps.append(_step(c.time, c, None))
        if any(steps[k].time > steps[k + 1].time for k in range(len(steps) - 1)):
            steps.sort(key=lambda s: (s.time, s.call.seq if s.call else 0))
        return steps


def build_transitions(
    store: Store, rollouts: Iterable[Rollout], config: TransitionConfig | None = None
) -> tuple[list[Transition], BuildReport]:
    """Build the transitions of ``rollouts`` from ``store``; return them with the build's report."""
    builder = TransitionBuilder(store, config)
    transitions = builder.build(rollouts)
    return transitions, builder.report
