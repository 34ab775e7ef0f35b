"""The agent's instructions and one worked example, kept short for a 135M model.

The engine appends the tool definitions and the ``<tool_call>`` convention to the
instructions (``agl_verl.engines.tools``), about 150 tokens. Without an example,
SmolLM2-135M-Instruct invented argument keys (``"title"``), searched for words like
"search_args", and answered by imitating a ``<tool_response>`` block (8 validation
questions: F1 0, see the README). The example is a two-hop episode as Responses
input items (a question, two ``function_call`` items with their outputs, the answer),
about 120 tokens, about entities that are not in the collection.
"""

from __future__ import annotations

INSTRUCTIONS = "Answer the question with the search tool. Search for each name you need. Reply with only the answer."

EXAMPLE_QUESTION = "Where was the founder of Kora Labs born?"
EXAMPLE_STEPS = (
    ("Kora Labs", "Kora Labs makes maps. It was founded by Ivo Tam in 1950 and is based in Vell."),
    ("Ivo Tam", "Ivo Tam was a baker, born in Soran."),
)
EXAMPLE_ANSWER = "Soran"


def example_items() -> list[dict]:
    """The worked example as Responses API input items (what ``Runner.run`` takes as prior turns)."""
    items: list[dict] = [{"role": "user", "content": EXAMPLE_QUESTION}]
    for i, (query, passages) in enumerate(EXAMPLE_STEPS):
        call_id = f"call_example_{i}"
        items.append(
            {"type": "function_call", "call_id": call_id, "name": "search", "arguments": f'{{"query": "{query}"}}'}
        )
        items.append({"type": "function_call_output", "call_id": call_id, "output": passages})
    items.append({"role": "assistant", "content": EXAMPLE_ANSWER})
    return items


def agent_input(question: str) -> list[dict]:
    """The run's input: the worked example, then the question."""
    return [*example_items(), {"role": "user", "content": question}]
