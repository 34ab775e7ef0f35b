"""A reward plugin the distributed-mode tests load in verl's Ray workers by its module path."""

import agl


@agl.hookimpl
def agl_reward(rollout):
    """1.0 when the agent's output repeats the task's ``q``, else 0.0."""
    output = rollout.output or {}
    return float(isinstance(output, dict) and output.get("answer") == rollout.task.input.get("q"))
