"""An OpenAI Agents SDK retrieval agent over a generated collection, trained with agl (see README.md)."""
