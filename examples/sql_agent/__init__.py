"""A three-node LangGraph text-to-SQL agent over Chinook, trained with agl (see docs/results/sql-agent.md)."""
