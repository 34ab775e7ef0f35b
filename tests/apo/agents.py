"""A tiny agent whose reward depends on its resources, so candidate prompts really score differently.

Each task needs one quality (``brief``, ``polite`` or ``exact``): the reward is 0.8 when the system
prompt names it, plus 0.2 when the agent was given few-shot examples. The agent makes one model
call with its prompt: through agl's gateway (the engine records token ids), or, with
``resources["hosted_url"]``, straight to a hosted-model-like endpoint, recorded as an LLM span
the way an instrumentation records a hosted model's call (a text-only transition).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import httpx

import agl

NEEDS = ("brief", "polite", "exact")


def tasks(n: int, split: str) -> list[dict]:
    return [
        {"task_id": f"{split}-{i}", "input": {"question": f"question {i}", "needs": NEEDS[i % 3]}} for i in range(n)
    ]


def _messages(task_input: dict, resources: dict) -> list[dict]:
    demos = resources.get("few_shot") or []
    system = resources["system_prompt"] + ("\n\nExamples:\n" + "\n\n".join(demos) if demos else "")
    return [{"role": "system", "content": system}, {"role": "user", "content": task_input["question"]}]


def agent(task_input: dict, ctx: agl.RolloutContext) -> float:
    resources = ctx.resources
    messages = _messages(task_input, resources)
    hosted = resources.get("hosted_url")
    if hosted is None:
        url, key, model, recorded = ctx.base_url, ctx.api_key, ctx.model, contextlib.nullcontext()
    else:  # what an instrumentation records of a hosted model's call: the messages in and out
        url, key, model = hosted, "hosted-key", "hosted-agent"
        recorded = agl.span("chat hosted-agent", kind="llm", **{"gen_ai.input.messages": json.dumps(messages)})
    with recorded as sp, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        reply = client.post("/chat/completions", json={"model": model, "messages": messages}).json()
        text = reply["choices"][0]["message"]["content"]
        if sp is not None:
            sp.attributes["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "content": text}])
    time.sleep(float(os.environ.get("APO_AGENT_SLEEP", "0")))
    return 0.8 * (task_input["needs"] in resources["system_prompt"].lower()) + 0.2 * bool(resources.get("few_shot"))
