"""An OpenAI Agents SDK retrieval agent over generated passages, trained with agl (see docs/results/rag-agent.md)."""
