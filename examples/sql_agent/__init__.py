"""A three-node LangGraph text-to-SQL agent over Chinook, trained with agl (see README.md)."""
