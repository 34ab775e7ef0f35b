"""The agent: an ordinary LangChain chain, plus one callback handler.

Nothing here knows about training except ``AglCallbackHandler``: the model
endpoint comes from the rollout context (in production it would come from
``OPENAI_BASE_URL``), and the answer is scored afterwards by the reward plugin in
``rewards.py``.
"""

from __future__ import annotations

import openai
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI

from agl_langchain import AGENT_METADATA_KEY, AglCallbackHandler

AGENT_NAME = "first_digit"
"""The agent's name in its spans (the chain has none of its own)."""
SYSTEM_PROMPT = "Say the first digit."
USER_PROMPT = "{digits}"

prompt = ChatPromptTemplate.from_messages([("system", SYSTEM_PROMPT), ("user", USER_PROMPT)])

# One connection pool for every rollout: building a new one (and its TLS context)
# per ChatOpenAI costs tens of milliseconds, more than the tiny model's answer.
_http_client = openai.DefaultHttpxClient()
_http_async_client = openai.DefaultAsyncHttpxClient()


def first_digit_agent(task: dict, ctx) -> str:
    """Ask the model for the first digit; return its answer as the rollout's output."""
    llm = ChatOpenAI(
        base_url=ctx.base_url,
        api_key=ctx.api_key,
        model=ctx.model,
        temperature=ctx.resources.get("temperature", 1.0),
        max_tokens=ctx.resources.get("max_tokens", 2),
        max_retries=0,
        http_client=_http_client,
        http_async_client=_http_async_client,
    )
    chain = prompt | llm | StrOutputParser()
    # A chain outside any LangGraph graph has no agent name of its own: the agl_agent metadata
    # gives it one, which the dashboard's agent column, the filters and transitions.agents use.
    config = {"callbacks": [AglCallbackHandler()], "metadata": {AGENT_METADATA_KEY: AGENT_NAME}}
    return chain.invoke({"digits": task["digits"]}, config=config)
