"""The transitions a run trained on, counted per step in its work directory, so a resumed run counts
an interrupted step once (the results file's ``trained_transitions``)."""

from __future__ import annotations


def test_transition_counts_kept_in_the_workdir_count_a_resumed_run_once_per_step(tmp_path):
    from types import SimpleNamespace

    from agl_trainer.transition_counts import TransitionCounts

    path = tmp_path / "transition_counts.json"
    first = TransitionCounts(path)
    first.agl_transitions_built(step=1, transitions=[SimpleNamespace(agent="solver")] * 3)
    first.agl_transitions_built(step=2, transitions=[SimpleNamespace(agent="solver")] * 5)  # then killed
    resumed = TransitionCounts(path)  # a new process: step 1 completed, step 2 runs again
    resumed.agl_transitions_built(step=2, transitions=[SimpleNamespace(agent="solver"), SimpleNamespace(agent=None)])
    assert resumed.by_agent == {"solver": 4, "(none)": 1}
    assert TransitionCounts().by_agent == {}  # without a path, nothing is read or written
