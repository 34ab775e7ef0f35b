"""The prompt and the answer format, kept short for a 135M model.

The assistant is told to put the whole problem into one calculator expression (whose
result the agent reports as ``ANSWER: <result>``), or else to reply ``ANSWER: <number>``; one worked example
(another kind of story) shows the call, as chat history in the agent's model context. The engine renders
the calculator's definition into the system prompt (SmolLM2's chat template has no
tool section; see ``agl_verl/engines/tools.py``).
"""

from __future__ import annotations

import json
import math
import re

from autogen_core import FunctionCall
from autogen_core.models import (
    AssistantMessage,
    LLMMessage,
    UserMessage,
)

SYSTEM_MESSAGE = (
    "Solve the problem with the calculate tool: pass it one expression for the whole problem. "
    "Without the tool, reply ANSWER: <number>."
)

EXAMPLE_QUESTION = (
    "A club has 1250 cards. It gets 340 more cards. It gives away 75 cards. How many cards does it have now?"
)
EXAMPLE_EXPRESSION = "1250 + 340 - 75"


def worked_example(tool_name: str, agent_name: str) -> list[LLMMessage]:
    """One worked example as chat history: a question and the assistant's calculator call for it.

    Given to the agent as the initial messages of its model context, so the model sees a
    call in exactly the form the engine renders (and parses) for this model. The example
    stops at the call: with the tool's result and an ``ANSWER:`` turn after it, SmolLM2
    answered new questions by imitating the tool-result turn instead (see docs/results/calc-agent.md).
    """
    call = FunctionCall(id="call_example", name=tool_name, arguments=json.dumps({"expression": EXAMPLE_EXPRESSION}))
    return [UserMessage(content=EXAMPLE_QUESTION, source="user"), AssistantMessage(content=[call], source=agent_name)]


def demonstrations(demos: list[str], agent_name: str) -> list[LLMMessage]:
    """Few-shot examples as chat history: each ``Question: <q>\nAnswer: <a>`` text (agl-apo's form) as a
    question and the assistant's answer to it; a text not of that form is shown as the question alone."""
    out: list[LLMMessage] = []
    for demo in demos:
        question, _, answer = demo.removeprefix("Question: ").partition("\nAnswer: ")
        out.append(UserMessage(content=question, source="user"))
        if answer:
            out.append(AssistantMessage(content=answer, source=agent_name))
    return out


_ANSWER = re.compile(r"ANSWER\s*[:=]\s*\**\s*(-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)", re.IGNORECASE)


def parse_answer(text: object) -> float | None:
    """The number after the last ``ANSWER:`` in ``text`` (commas as thousands separators); else None.

    Anything that is not a string, has no ``ANSWER:`` marker or no finite number after
    it gives None; nothing here raises.
    """
    if not isinstance(text, str):
        return None
    found = _ANSWER.findall(text)
    if not found:
        return None
    try:
        value = float(found[-1].replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None
