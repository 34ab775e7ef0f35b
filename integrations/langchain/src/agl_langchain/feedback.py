"""Rewards after the fact: user feedback or a judge scoring a run that already ended.

Production runs (outside any training rollout) are stored with no rollout id;
their span ids are the LangChain run ids. Rewarding one later attaches a
:class:`agl.Reward` to that span, which trainers and exporters read back with the
span (``store.query_rewards(production=True)``).
"""

from __future__ import annotations

from uuid import UUID

from agl.capture import production_writer
from agl.schema import Reward
from agl.store.base import Store


def span_id_of(run_id: UUID | str) -> str:
    """The agl span id of a LangChain run id."""
    return str(run_id) if isinstance(run_id, UUID) else str(UUID(str(run_id)))


def reward_run(
    run_id: UUID | str,
    value: float,
    *,
    name: str = "feedback",
    source: str = "user",
    rollout_id: str | None = None,
    store: Store | None = None,
) -> Reward:
    """Reward the LangChain run ``run_id`` (its span) after it ended.

    Get the run id by passing one (``config={"run_id": uuid.uuid4()}``) or from
    ``langchain_core.tracers.context.collect_runs``. The reward is written to
    ``store`` at once if given, else buffered to the production store (the one
    named by ``AGL_STORE_URL``) like every production span.

    Raises ValueError when ``value`` is not a number or ``run_id`` is not a UUID.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"value: a reward must be a number, got {value!r}")
    try:
        span_id = span_id_of(run_id)
    except ValueError as exc:
        raise ValueError(f"run_id: not a LangChain run id (a UUID): {run_id!r}") from exc
    reward = Reward(rollout_id=rollout_id, span_id=span_id, name=name, value=float(value), source=source)
    if store is not None:
        store.add_rewards([reward])
    else:
        production_writer().put(reward)
    return reward
