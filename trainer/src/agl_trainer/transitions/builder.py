"""The builder: reads chunks of ended rollouts, joins their spans and calls, rewards them and assigns credit."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import NamedTuple

from agl.schema import RETURN_SOURCE, Reward, Rollout, RolloutStatus, Task, Transition, sampling_of
from agl.store.base import Store
from agl_trainer.credit import RolloutRewards
from agl_trainer.transitions.config import BuildReport, TransitionConfig
from agl_trainer.transitions.merge import merge_prefix
from agl_trainer.transitions.messages import (
    messages_list,
    normalize_messages,
    output_text,
    request_messages,
    response_text,
)
from agl_trainer.transitions.readers import Reader, reader_for
from agl_trainer.transitions.records import AnyReward, CallRecord, Chunk, SpanRecord, Step, make_step
from agl_trainer.transitions.rewards import final_reward, index_before, plugin_rewards, with_task

log = logging.getLogger("agl_trainer.transitions")

CHUNK = 200
"""Rollouts read from the store per round trip."""

_by_seq = attrgetter("seq")
_NO_REWARDS: list[Reward] = []


class _Joined(NamedTuple):
    """A rollout's joined steps in order, as parallel lists (what the hot loops read)."""

    calls: list[CallRecord | None]
    """Each step's gateway record (None: text-only)."""
    spans: list[SpanRecord | None]
    """Each step's span (None: gateway-only)."""
    agents: list[str | None]
    """Each step's agent (its span's)."""
    times: list[float] | None
    """Each step's time; None where the steps are the calls (their times are the calls' own)."""


_TEMPLATE = Transition(
    rollout_id="-",
    task_id="-",
    step=0,
    agent=None,
    prompt_ids=[],
    response_ids=[],
    response_logprobs=None,
    behaviour_logprobs=None,
    reward=0.0,
    model_version=None,
    policy=None,
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

    def __init__(self, store: Store, config: TransitionConfig | None = None, reader: Reader | None = None):
        """Build from ``store`` by ``config`` (the defaults if None), reading through ``reader``.

        ``reader`` must read ``store``; None takes :func:`~agl_trainer.transitions.readers.reader_for`'s
        choice (the bulk reads on a SQL store, the public queries on any other).
        """
        from agl.plugins import get_plugin_manager, resolve, reward_answers

        self.store = store
        self.config = config or TransitionConfig()
        self.strategy = resolve("credit_assignment", self.config.credit)
        if reader is None:
            reader = reader_for(store)
        elif reader.store is not store:
            raise ValueError(f"reader: {type(reader).__name__} reads another store than the builder's {store!r}")
        self.reader: Reader = reader
        """Where the records come from."""
        self.report = BuildReport()
        self.finals: dict[str, float] = {}
        """Each built rollout's final reward (after precedence and the failed/missing defaults)."""
        self._agents = None if self.config.agents is None else frozenset(self.config.agents)
        self._reward_call = reward_answers
        impls = get_plugin_manager().hook.agl_reward.get_hookimpls() if self.config.reward_plugins else []
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

        reader = self.reader
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

    def _chunk(self, live: list[Rollout], chunk: Chunk) -> list[Transition]:
        """The transitions of a chunk of ended rollouts, given the chunk's records."""
        plugin = self._run_reward_plugins(live, chunk) if self._has_plugins else {}
        out: list[Transition] = []
        report = self.report
        for r in live:
            report.rollouts += 1
            self._rollout(r, chunk, plugin.get(r.rollout_id, _NO_REWARDS), out)
        return out

    def _run_reward_plugins(self, live: list[Rollout], chunk: Chunk) -> dict[str, list[Reward]]:
        """Run the reward plugins on each rollout; store the rows not stored yet. Their rows by rollout id."""
        tasks = self._tasks
        missing = sorted({r.task_id for r in live if r.task is None and r.task_id not in tasks})
        if missing:
            tasks.update(self.reader.tasks(missing))
        store, report, call, stored_rewards = self.store, self.report, self._reward_call, chunk.rewards
        by_rollout: dict[str, list[Reward]] = {}
        new: list[Reward] = []
        for r in live:
            if r.task is None:
                task = tasks.get(r.task_id)
                if task is not None:
                    r = with_task(r, task)
            got = plugin_rewards(r, store, report, call)
            by_rollout[r.rollout_id] = got
            if got:
                have = stored_rewards.get(r.rollout_id)
                if have:
                    stored = {w.reward_id for w in have}
                    new.extend(w for w in got if w.reward_id not in stored)
                else:
                    new.extend(got)
        if new:
            store.add_rewards(new)
        return by_rollout

    def _rollout(self, rollout: Rollout, chunk: Chunk, plugin: list[Reward], out: list[Transition]) -> None:
        """Append the transitions of one rollout to ``out``: join, rewards, credit, then selection and weighting."""
        calls, spans, rewards = self._records(rollout, chunk)
        joined = self._join(rollout.rollout_id, calls, spans)
        rewarded = self._rewards(rollout, rewards, plugin, joined)
        if rewarded is None:
            return
        final, intermediate = rewarded
        self.finals[rollout.rollout_id] = final
        n_steps = len(joined.calls)
        if not n_steps:
            self.report.drop("no_calls")
            return
        per_call = self._credit(rollout.rollout_id, n_steps, final, intermediate)
        kept = self._selected(joined)
        if kept and self.config.merge == "prefix":
            rows: list[Transition] = []
            self._emit(rollout, joined, kept, per_call, rows)
            merged = merge_prefix(rows, self.report)
            self.report.transitions -= len(rows) - len(merged)
            out.extend(merged)
        elif kept:
            self._emit(rollout, joined, kept, per_call, out)

    def _records(self, rollout: Rollout, chunk: Chunk) -> tuple[list[CallRecord], list[SpanRecord], list[AnyReward]]:
        """The rollout's calls, spans and rewards that count.

        Left out: rows of the reward plugins (recomputed for every build), records of
        an earlier attempt (counted as ``stale_records``) and aborted calls (counted).
        """
        rid = rollout.rollout_id
        calls = chunk.calls.get(rid, [])
        spans = chunk.spans.get(rid, [])
        rewards = chunk.rewards.get(rid, [])
        plugin_names = self._plugin_names
        if plugin_names and rewards:
            rewards = [w for w in rewards if w.source not in plugin_names]
        if rollout.attempt > 1 and rollout.started_at is not None:
            start = rollout.started_at
            n = len(calls) + len(spans) + len(rewards)
            calls = [c for c in calls if c.time >= start]
            spans = [s for s in spans if s.time >= start]
            rewards = [w for w in rewards if w.created_at >= start]
            self.report.stale_records += n - len(calls) - len(spans) - len(rewards)
        if calls:
            calls = self._drop_aborted(calls)
        return calls, spans, rewards

    def _drop_aborted(self, calls: list[CallRecord]) -> list[CallRecord]:
        """``calls`` without the aborted ones (recorded with no response ids), counted in the report."""
        kept = [c for c in calls if len(c.response_ids)]
        self.report.aborted_calls += len(calls) - len(kept)
        return kept

    def _rewards(
        self, rollout: Rollout, rewards: list[AnyReward], plugin: list[Reward], joined: _Joined
    ) -> tuple[float, list[tuple[int, float]]] | None:
        """The final reward and the intermediate ones, each placed after the last step before it.

        None where the rollout has no final reward and its default (``missing_reward``,
        ``failed_reward``) is None: the rollout is dropped, counted by reason.
        """
        cfg = self.config
        if plugin and rewards and cfg.agent_rewards == "without_plugin":
            kept = [w for w in rewards if w.source == RETURN_SOURCE]
            self.report.agent_rewards_ignored += len(rewards) - len(kept)
            rewards = kept
        final, chosen = final_reward([*rewards, *plugin] if plugin else rewards, self._plugin_names)
        if final is None:
            if rollout.status == RolloutStatus.SUCCEEDED:
                final, reason = cfg.missing_reward, "no_reward"
            else:
                final, reason = cfg.failed_reward, rollout.status.value
            if final is None:
                self.report.drop(reason)
                return None
        intermediate = []
        if rewards:
            times = joined.times if joined.times is not None else [c.time for c in joined.calls]
            for w in rewards:
                if w is not chosen and w.source != RETURN_SOURCE:
                    intermediate.append((index_before(times, w.created_at), w.value))
        return final, intermediate

    def _credit(self, rid: str, n_steps: int, final: float, intermediate: list[tuple[int, float]]) -> Sequence[float]:
        """Each step's reward, from the config's credit strategy."""
        cfg = self.config
        per_call = self.strategy(n_steps, RolloutRewards(final=final, emitted=intermediate), **cfg.credit_options)
        if len(per_call) != n_steps:
            raise ValueError(
                f"credit: strategy {cfg.credit!r} returned {len(per_call)} rewards for {n_steps} calls of rollout {rid}"
            )
        return per_call

    def _selected(self, joined: _Joined) -> Sequence[int]:
        """The steps to train: the selected agents' (the others counted), text-only ones only if ``text_only``."""
        n_steps = len(joined.calls)
        served = self.report.policy_calls
        for c in joined.calls:
            if c is not None and c.policy is not None:
                served[c.policy] = served.get(c.policy, 0) + 1
        agents = self._agents
        if agents is None:
            kept: Sequence[int] = range(n_steps)
        else:
            kept = [i for i, a in enumerate(joined.agents) if a in agents]
            self.report.filtered_out += n_steps - len(kept)
        if not self.config.text_only:
            step_calls = joined.calls
            kept = [i for i in kept if step_calls[i] is not None]
        return kept

    def _emit(
        self, rollout: Rollout, joined: _Joined, kept: Sequence[int], per_call: Sequence[float], out: list[Transition]
    ) -> None:
        """Append the transitions of the ``kept`` steps to ``out``, weighted by the config's ``normalize``."""
        cfg, reader = self.config, self.reader
        step_calls, step_spans, step_agents = joined.calls, joined.spans, joined.agents
        with_text, with_sampling = cfg.with_text, cfg.with_sampling
        if with_text or with_sampling:
            reader.load_calls([step_calls[i] for i in kept if step_calls[i] is not None])
        if with_text:
            for i in kept:
                if step_spans[i] is not None:
                    reader.load_span(step_spans[i])
        weight = 1.0 / len(kept) if cfg.normalize == "rollout" else 1.0
        rid, task_id, fallback_version = rollout.rollout_id, rollout.task_id, rollout.model_version
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
                        "behaviour_logprobs": c.behaviour,
                        "reward": float(per_call[i]),
                        "model_version": c.model_version or fallback_version,
                        "policy": c.policy,
                        "call_id": c.call_id,
                        "weight": weight,
                    }
                )
                if with_sampling:
                    t.sampling = sampling_of(c.request)
                if with_text:
                    t.prompt_messages = messages_list(request_messages(c.request or {}))
                    t.response_text = response_text(c.response or {})
            else:
                t = self._text_transition(rollout, i, step_spans[i], float(per_call[i]), weight)
            append(t)
        self.report.transitions += len(kept)

    def _text_transition(
        self, rollout: Rollout, step: int, span: SpanRecord, reward: float, weight: float
    ) -> Transition:
        """The text-only transition of a span with no gateway record: its messages, no token ids."""
        self.reader.load_span(span)
        return _copy_template(
            update={
                "rollout_id": rollout.rollout_id,
                "task_id": rollout.task_id,
                "step": step,
                "agent": span.agent,
                "token_source": "text",
                "prompt_ids": array("i"),
                "response_ids": array("i"),
                "response_logprobs": None,
                "prompt_messages": messages_list(span.input_messages),
                "response_text": output_text(span.output_messages),
                "reward": reward,
                "model_version": rollout.model_version,
                "call_id": span.response_id,
                "weight": weight,
            }
        )

    def _join(self, rid: str, calls: list[CallRecord], spans: list[SpanRecord]) -> _Joined:
        """The rollout's steps in order (the rules are in :mod:`agl_trainer.transitions`)."""
        report = self.report
        if len(calls) > 1:
            calls.sort(key=_by_seq)
        if not spans:
            report.gateway_only += len(calls)
            if calls:
                report.spanless(rid)
            return _Joined(calls, [None] * len(calls), [None] * len(calls), None)
        if len(spans) == len(calls):
            # The common case: every call has its span, joined by response id; the gateway's order stands.
            span_of = {sp.response_id: sp for sp in spans}
            if len(span_of) == len(calls):
                get = span_of.get
                matched = [get(c.call_id) for c in calls]
                if all(matched):  # every call has its span (a record is always true; None is not)
                    report.joined_by_id += len(calls)
                    return _Joined(calls, matched, [sp.agent for sp in matched], None)
        steps = self._join_steps(rid, calls, spans)
        return _Joined(
            [s.call for s in steps], [s.span for s in steps], [s.agent for s in steps], [s.time for s in steps]
        )

    def _join_steps(self, rid: str, calls: list[CallRecord], spans: list[SpanRecord]) -> list[Step]:
        """The general join (some span has no response id, or one the gateway never issued); ``calls`` sorted."""
        report = self.report
        spans.sort(key=_by_seq)
        by_id = {c.call_id: c for c in calls}
        taken: set[str] = set()
        steps = []
        orphans: list[SpanRecord] = []
        for sp in spans:
            if sp.response_id is None:
                orphans.append(sp)
                continue
            c = by_id.get(sp.response_id)
            if c is not None and c.call_id in taken:
                report.duplicate_spans += 1  # a second tracer of the same call: the first span stands
            elif c is None:
                report.text_only += 1
                steps.append(make_step(sp.time, None, sp))
            else:
                taken.add(c.call_id)
                report.joined_by_id += 1
                steps.append(make_step(c.time, c, sp))
        if orphans:
            left = [c for c in calls if c.call_id not in taken]
            if not left:
                for sp in orphans:
                    report.text_only += 1
                    steps.append(make_step(sp.time, None, sp))
            else:
                self.reader.load_calls(left)
                pos = 0
                for sp in orphans:
                    self.reader.load_span(sp)
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
                    steps.append(make_step(c.time, c, sp))
        for c in calls:
            if c.call_id not in taken:
                report.gateway_only += 1
                steps.append(make_step(c.time, c, None))
        if calls and not taken:
            report.spanless(rid)
        if any(steps[k].time > steps[k + 1].time for k in range(len(steps) - 1)):
            steps.sort(key=lambda s: (s.time, s.call.seq if s.call else 0))
        return steps


def build_transitions(
    store: Store, rollouts: Iterable[Rollout], config: TransitionConfig | None = None, *, reader: Reader | None = None
) -> tuple[list[Transition], BuildReport]:
    """Build the transitions of ``rollouts`` from ``store``; return them with the build's report.

    ``config`` and ``reader`` are :class:`TransitionBuilder`'s.
    """
    builder = TransitionBuilder(store, config, reader)
    transitions = builder.build(rollouts)
    return transitions, builder.report
