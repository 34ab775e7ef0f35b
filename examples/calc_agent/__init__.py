"""An AutoGen AgentChat assistant with an MCP calculator, trained with agl (see docs/results/calc-agent.md)."""
