"""The page of one rollout: its fields, the span tree on a time axis, each LLM call and its rewards.

Each LLM call shows the policy (in a run of several) and model version that served it, its
messages, response, tool calls and token counts; token ids shaded
by logprob where the gateway recorded them; and the reward it got after credit assignment
and whether it was trained, as :class:`agl_trainer.transitions.TransitionBuilder` (what ``agl export
transitions`` and the trainer use) gives them under the dashboard's transition config.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from agl.schema import LLMCall, Reward, Rollout, Span, Task
from agl.store.base import Store
from agl_trainer.dashboard.html import attr, e, number, path_id, pretty_json, seconds, when
from agl_trainer.transitions import TransitionBuilder, TransitionConfig
from agl_trainer.transitions.messages import request_messages, response_text

MAX_TOKENS_SHOWN = 2048


def _content(value: Any) -> str:
    if isinstance(value, str):
        return f"<pre>{e(value)}</pre>"
    return f"<pre>{pretty_json(value)}</pre>"


def _messages(messages: Any) -> str:
    if not isinstance(messages, list):
        return _content(messages)
    out = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(f'<div class="msg">{_content(m)}</div>')
            continue
        extra = {k: v for k, v in m.items() if k not in ("role", "content")}
        more = f"<pre>{pretty_json(extra)}</pre>" if extra else ""
        role = f'<div class="role">{e(m.get("role", ""))}</div>'
        out.append(f'<div class="msg">{role}{_content(m.get("content"))}{more}</div>')
    return "".join(out)


def _resources(resources: dict[str, Any]) -> str:
    """Each named resource the rollout ran with: a text as it reads, a list (few-shot examples) item by item."""
    rows = []
    for name, value in resources.items():
        items = value if isinstance(value, list) else [value]
        shown = "".join(_content(item) for item in items)
        rows.append(f'<div class="resource"><div class="role">{e(name)}</div>{shown}</div>')
    return "".join(rows)


def _tokens(ids: Any, logprobs: Any) -> str:
    ids = list(ids)[:MAX_TOKENS_SHOWN]
    lps = None if logprobs is None else list(logprobs)[:MAX_TOKENS_SHOWN]
    out = []
    for i, tok in enumerate(ids):
        if lps is not None and i < len(lps):
            p = math.exp(min(0.0, float(lps[i])))
            # Likely tokens stay pale; unlikely ones turn red.
            out.append(
                f'<span class="tok" style="background:rgba(211,47,47,{1 - p:.2f})" '
                f'title="logprob {float(lps[i]):.4f}" data-logprob="{float(lps[i]):.4f}">{int(tok)}</span>'
            )
        else:
            out.append(f'<span class="tok" style="background:#eceef2">{int(tok)}</span>')
    return "".join(out)


def _tool_calls(response: dict) -> Any:
    choices = response.get("choices")
    if choices and isinstance(choices[0], dict):
        return (choices[0].get("message") or {}).get("tool_calls")
    output = response.get("output")
    if isinstance(output, list):
        calls = [o for o in output if isinstance(o, dict) and o.get("type") == "function_call"]
        return calls or None
    content = response.get("content")  # an Anthropic Message: its tool_use blocks
    if response.get("type") == "message" and isinstance(content, list):
        return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"] or None
    return None


NOT_TRAINED_MODES = {"val": "a validation rollout"}
"""Rollout modes whose calls the trainer never trains on, and how the page says so."""


def _call_card(call: LLMCall, index: int, credit: dict[str, tuple[float, float]], rollout: Rollout) -> str:
    usage = call.response.get("usage") if isinstance(call.response.get("usage"), dict) else {}
    got = credit.get(call.call_id)
    trained_known = rollout.status.terminal
    if got is not None and rollout.mode in NOT_TRAINED_MODES:
        verdict = (
            f'<span class="muted">not trained</span> ({NOT_TRAINED_MODES[rollout.mode]}): '
            f'reward <b class="credit">{got[0]:.6g}</b> after credit assignment'
        )
    elif got is not None:
        verdict = (
            f'<span class="s-succeeded">trained</span>: reward <b class="credit">{got[0]:.6g}</b>, weight {got[1]:.4g}'
        )
    elif trained_known:
        verdict = '<span class="muted">not trained</span> (left out: agent filter, no reward, or not ended)'
    else:
        verdict = ""
    tool_calls = _tool_calls(call.response)
    text = response_text(call.response)
    return (
        f'<div class="card llm-call" id="call-{e(call.call_id)}"><h3>LLM call {index}: {e(call.call_id)}</h3>'
        f"<p>{verdict}</p>"
        "<p>"
        + (f"model {e(call.requested_model)} · " if call.requested_model else "")
        + (f'policy <b class="policy">{e(call.policy)}</b> · ' if call.policy else "")
        + (f"version {e(call.model_version)} · " if call.model_version else "")
        + f"prompt tokens <b>{len(call.prompt_ids)}</b> · response tokens <b>{len(call.response_ids)}</b>"
        + (f" · usage {e(usage)}" if usage else "")
        + (f" · latency {e(seconds(call.latency_s))}" if call.latency_s is not None else "")
        + "</p>"
        f"<details open><summary>messages</summary>{_messages(request_messages(call.request))}</details>"
        f"<details open><summary>response</summary><pre class='response'>{e(text)}</pre></details>"
        + (
            f"<details open><summary>tool calls</summary><pre>{pretty_json(tool_calls)}</pre></details>"
            if tool_calls
            else ""
        )
        + f"<details><summary>response token ids{' (shaded by logprob)' if call.response_logprobs is not None else ''}"
        f"</summary>{_tokens(call.response_ids, call.response_logprobs)}</details>"
        f"<details><summary>prompt token ids</summary>{_tokens(call.prompt_ids, None)}</details></div>"
    )


def _span_messages(span: Span) -> str:
    """An LLM span's prompt and answer (``gen_ai.input.messages`` / ``gen_ai.output.messages``),
    what a call captured without a gateway record shows."""
    out = []
    for key, label in (("gen_ai.input.messages", "messages"), ("gen_ai.output.messages", "output")):
        value = span.attributes.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # JSON text, as OpenTelemetry keeps it
                value = json.loads(value)
        if value is not None:
            out.append(f"<details open class='span-messages'><summary>{label}</summary>{_messages(value)}</details>")
    return "".join(out)


def _span_tree(spans: list[Span], rewards: list[Reward]) -> str:
    if not spans:
        return '<p class="muted">no spans</p>'
    t0 = min(s.start_time for s in spans)
    t1 = max([s.end_time or s.start_time for s in spans] + [s.start_time for s in spans])
    total = max(t1 - t0, 1e-9)
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        parent = s.parent_id if s.parent_id in ids else None
        children.setdefault(parent, []).append(s)
    by_span: dict[str, list[Reward]] = {}
    for r in rewards:
        if r.span_id:
            by_span.setdefault(r.span_id, []).append(r)
    rows: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: (x.start_time, x.seq)):
            end = s.end_time if s.end_time is not None else s.start_time
            left = (s.start_time - t0) / total * 100
            width = max((end - s.start_time) / total * 100, 0.3)
            tip = f"{s.name}: +{seconds(s.start_time - t0)}, {seconds(end - s.start_time)}"
            got = "".join(f" · {e(r.name)} = <b>{r.value:.6g}</b>" for r in by_span.get(s.span_id, []))
            rows.append(
                f'<div class="span" data-span-id={attr(s.span_id)} data-kind={attr(s.kind)}>'
                f'<div class="name" style="padding-left:{depth * 16}px">'
                f'<span class="kind k-{e(s.kind)}">{e(s.kind)}</span> <span class="span-name">{e(s.name)}</span>'
                f'{got} <span class="muted">{e(seconds(end - s.start_time))}</span></div>'
                f'<div class="lane"><div class="bar k-{e(s.kind)}" style="left:{left:.2f}%;width:{width:.2f}%" '
                f"title={attr(tip)}></div></div></div>"
                f"<details class='span-attrs' style='margin-left:{depth * 16 + 8}px'>"
                "<summary class='muted'>attributes</summary>"
                f"<pre>{pretty_json(s.attributes)}</pre></details>"
                + (f"<div style='margin-left:{depth * 16 + 8}px'>{_span_messages(s)}</div>" if s.kind == "llm" else "")
            )
            walk(s.span_id, depth + 1)

    walk(None, 0)
    axis = f'<p class="muted">time axis: 0 to {e(seconds(total))} from the first span\'s start</p>'
    return axis + '<div class="tree">' + "".join(rows) + "</div>"


def rollout_page(
    store: Store, rollout_id: str, *, prefix: str, config: TransitionConfig, config_origin: str = "default"
) -> str:
    """The body of a rollout's page (raises :class:`agl.errors.NotFound` for an unknown id).

    ``config`` is how its calls' rewards are assigned and which agents are trained;
    ``config_origin`` says where it came from."""
    rollout: Rollout = store.get_rollout(rollout_id)
    spans = list(store.query_spans(rollout_id=rollout_id))
    calls = list(store.query_llm_calls(rollout_id=rollout_id))
    rewards = list(store.query_rewards(rollout_id=rollout_id))
    task: Task | None
    try:
        task = store.get_task(rollout.task_id)
    except Exception:
        task = None
    credit: dict[str, tuple[float, float]] = {}
    final = None
    if rollout.status.terminal:
        builder = TransitionBuilder(store, config.model_copy(update={"merge": "off"}))  # each call's own credit
        for t in builder.build([rollout]):
            if t.call_id is not None:
                credit[t.call_id] = (t.reward, t.weight)
        final = builder.finals.get(rollout.rollout_id)
    duration = None
    if rollout.started_at is not None and rollout.ended_at is not None:
        duration = rollout.ended_at - rollout.started_at
    fields = [
        ("status", f'<span class="s-{e(rollout.status.value)} status">{e(rollout.status.value)}</span>'),
        ("task", f"<a href={attr(f'{prefix}/rollouts?task={path_id(rollout.task_id)}')}>{e(rollout.task_id)}</a>"),
        ("mode", e(rollout.mode)),
        ("step", e(rollout.step)),
        ("model version", e(rollout.model_version)),
        ("resources version", e(rollout.resources_version)),
        ("attempt", f"{rollout.attempt} of {rollout.max_attempts}"),
        ("runner", e(rollout.runner_id)),
        ("created", e(when(rollout.created_at))),
        ("duration", e(seconds(duration))),
        (
            "credit",
            f'<span class="credit-config">{e(config.credit)}, agents {e(", ".join(config.agents or ["all"]))}</span>'
            f' <span class="muted">({e(config_origin)})</span>',
        ),
        ("final reward", f'<b class="final-reward">{e(number(final, 6))}</b>' if final is not None else "none"),
        ("error", f'<pre class="err">{e(rollout.error)}</pre>' if rollout.error else ""),
        ("output", f"<pre>{pretty_json(rollout.output)}</pre>" if rollout.output is not None else ""),
        ("resources", _resources(rollout.resources)),
    ]
    table = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in fields)
    reward_rows = "".join(
        f"<tr><td>{e(r.name)}</td><td class='num reward-value'>{r.value:.6g}</td><td>{e(r.source)}</td>"
        f"<td>{e(r.span_id)}</td><td>{e(when(r.created_at))}</td></tr>"
        for r in rewards
    )
    form_action = f"{prefix}/rollouts/{path_id(rollout.rollout_id)}/reward"
    reward_form = (
        f'<form method="post" action={attr(form_action)} class="reward-form">'
        '<label>value <input name="value" required inputmode="decimal" size="8"></label> '
        '<label>name <input name="name" value="reward" size="10"></label> '
        '<label>source <input name="source" value="human" size="10"></label> '
        "<button>Attach reward</button></form>"
    )
    calls_html = "".join(_call_card(c, i, credit, rollout) for i, c in enumerate(calls))
    return (
        f"<h2>Rollout {e(rollout.rollout_id)}</h2>"
        f'<div class="card"><table class="fields">{table}</table></div>'
        + (f'<div class="card"><h3>Task input</h3><pre>{pretty_json(task.input)}</pre></div>' if task else "")
        + f'<div class="card"><h3>Span tree</h3>{_span_tree(spans, rewards)}</div>'
        f'<div class="card"><h3>Rewards</h3><table class="rewards"><tr><th>name</th><th>value</th><th>source</th>'
        f"<th>span</th><th>at</th></tr>{reward_rows}</table><p>{reward_form}</p></div>"
        f"<h3>LLM calls ({len(calls)})</h3>{calls_html or '<p class=muted>no gateway records</p>'}"
    )
