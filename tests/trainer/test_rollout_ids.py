"""Which of a run's rollouts count after a resume (agl_trainer.rollout_ids)."""

from agl.schema import Rollout
from agl_trainer.rollout_ids import generation, latest_by_step, rollout_prefix


def test_a_resume_names_its_rollouts_apart_and_only_the_run_s_count():
    assert rollout_prefix({"run_id": "run-a"}) == "run-a"  # a state saved before resumes were counted
    assert rollout_prefix({"run_id": "run-a", "resumes": 0}) == "run-a"
    assert rollout_prefix({"run_id": "run-a", "resumes": 2}) == "run-a-resume2"
    assert generation("run-a-s3-b0-r1", "run-a") == 0
    assert generation("run-a-resume2-val4-0", "run-a") == 2
    assert generation("run-ab-s1-b0-r0", "run-a") is None  # another run whose id begins alike
    assert generation("prod-123", "run-a") is None


def test_of_a_step_run_again_only_the_rerun_counts():
    def r(rid: str, step: int, mode: str = "train") -> Rollout:
        return Rollout(rollout_id=rid, task_id="t", step=step, mode=mode)

    rollouts = [
        r("run-a-val0-0", 0, "val"),
        r("run-a-s1-b0-r0", 1),
        r("run-a-s2-b0-r0", 2),  # ended before the kill: superseded
        r("run-a-s2-b0-r1", 2),  # cancelled on resume: superseded
        r("run-a-resume1-s2-b0-r0", 2),
        r("run-a-resume1-s2-b0-r1", 2),
        r("run-a-resume1-val3-0", 3, "val"),
        r("other-s2-b0-r0", 2),
    ]
    counted = [x.rollout_id for x in latest_by_step(rollouts, "run-a")]
    assert counted == [
        "run-a-val0-0",
        "run-a-s1-b0-r0",
        "run-a-resume1-s2-b0-r0",
        "run-a-resume1-s2-b0-r1",
        "run-a-resume1-val3-0",
    ]
