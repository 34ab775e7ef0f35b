"""The ``apo`` backend under the real trainer: SqliteStore, the gateway, the in-process runner, a
subprocess killed with SIGKILL, and an optimizer model that is scripted (tests/apo/scripted_model.py:
a real HTTP server whose answers are a script, because the tests must know what it writes).

The agent (tests/apo/agents.py) is rewarded for what its prompt says, so candidates really score
differently: "Answer." scores 0, "Be brief." 0.27, "Be brief and polite." 0.53, "Be brief, polite
and exact." 0.8 on the six validation tasks, and few-shot examples add 0.2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agl.schema import RolloutStatus
from agl.store.sqlite import SqliteStore
from agl_trainer.trainer import Trainer
from tests.apo.agents import agent, tasks
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
FIRST = "Answer."


def apo_config(tmp_path: Path, optimizer_url: str, steps: int = 2, **changes) -> dict:
    config = {
        "workdir": str(tmp_path / "run"),
        "store": f"sqlite:///{tmp_path / 'run' / 'agl.db'}",
        "steps": steps,
        "batch_size": 3,
        "n_rollouts": 1,
        "progress": False,
        "plot": False,
        "rollout": {"concurrency": 3, "heartbeat_s": 0.2},
        "resources": {"system_prompt": FIRST, "few_shot": []},
        "backend": {
            "name": "apo",
            "config": {
                "optimizer": {"base_url": optimizer_url, "model": "scripted-optimizer"},
                "methods": ["textual_gradient", "bootstrap_demos"],
                "beam_width": 2,
                "candidates_per_step": 2,
                "val_batch_size": 6,
            },
        },
    }
    config.update(changes)
    return config


def candidates(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "apo" / "candidates.jsonl").read_text().splitlines()]


def test_the_beam_keeps_the_best_and_the_next_rollouts_run_with_the_chosen_resources(tmp_path, engine, scripted):
    config = apo_config(tmp_path, scripted.url, engine_urls=[engine.url])
    result = Trainer(config).fit(agent, tasks(3, "train"), tasks(6, "val"))
    assert result.steps_completed == 2
    lines = candidates(tmp_path / "run")
    step1 = {c["prompt"]: c for c in lines if c["step"] == 1}
    # step 1: the first prompt, and the two rewrites of the scripted critique, each scored on the 6 val tasks
    assert {p: round(c["score"], 3) for p, c in step1.items()} == {
        FIRST: 0.0,
        "Be brief.": 0.267,
        "Be brief and polite.": 0.533,
    }
    first = step1[FIRST]["id"]
    polite = step1["Be brief and polite."]
    assert first == "r0" and polite["parent"] == "r0" and polite["method"] == "textual_gradient"
    assert polite["critique"] == "The instructions never say what the answers need: brevity, politeness, exactness."
    assert "-Answer.\n+Be brief and polite.\n" in polite["diff"] and polite["diff"].startswith("--- a/system_prompt")
    assert all(len(c["scores"]) == 6 for c in lines)
    # step 2: the beam kept after step 1 (polite, brief) is scored again beside the new candidates
    step2 = [c for c in lines if c["step"] == 2]
    assert {c["id"] for c in step2} >= {polite["id"], step1["Be brief."]["id"]}
    exact = next(c for c in step2 if c["prompt"] == "Be brief, polite and exact.")
    demos = [c for c in step2 if c["method"] == "bootstrap_demos"]
    assert exact["parent"] == polite["id"] and round(exact["score"], 3) == 0.8
    assert len(demos) == 2 and all(c["parent"] == polite["id"] and round(c["score"], 3) == 0.733 for c in demos)
    for c in demos:  # demonstrations from the step's best rollouts (the brief and polite tasks), as Question/Answer
        assert c["resources"]["system_prompt"] == "Be brief and polite." and 1 <= len(c["resources"]["few_shot"]) <= 3
        assert all(d.startswith("Question: question ") and "\nAnswer: echo: " in d for d in c["resources"]["few_shot"])
    # the beam after step 2: the two best of the step, the older of the two tied demo candidates second
    beam = json.loads((tmp_path / "run" / "checkpoints" / "step-2" / "apo_state.json").read_text())["beam"]
    assert [c["version"] for c in beam] == [exact["id"], demos[0]["id"]]
    made = [int(c["id"].split("-")[0].split("c")[1]) for c in demos]  # s<step>c<k>-<digest>: k counts up
    assert made[0] < made[1]

    store = SqliteStore(tmp_path / "run" / "agl.db")
    try:
        train = {s: [r for r in store.query_rollouts(step=s) if r.mode == "train"] for s in (1, 2)}
        assert {(r.resources_version, r.resources["system_prompt"]) for r in train[1]} == {("r0", FIRST)}
        assert {(r.resources_version, r.resources["system_prompt"]) for r in train[2]} == {
            (polite["id"], "Be brief and polite.")
        }
        # what the agent sent: the chosen prompt, as the gateway recorded the step-2 calls
        for r in train[2]:
            [call] = store.query_llm_calls(rollout_id=r.rollout_id)
            assert call.request["messages"][0] == {"role": "system", "content": "Be brief and polite."}
        # the final evaluation runs with the best of the beam after step 2: the exact prompt
        after = [r for r in store.query_rollouts(step=3) if r.mode == "val" and "-val3-" in r.rollout_id]
        assert len(after) == 6 and {r.resources_version for r in after} == {exact["id"]}
        # the scoring rollouts are val rollouts, never trained on, one per candidate and task
        scored = [r for r in store.query_rollouts() if "-score" in r.rollout_id]
        assert len(scored) == 6 * len(lines) and {r.mode for r in scored} == {"val"}
        assert all(r.status == RolloutStatus.SUCCEEDED for r in scored)
        published = store.get_model_version(result.model_version)
        assert published.path is None and published.metadata["resources_version"] == exact["id"]
    finally:
        store.close()
    assert result.after["val_reward_mean"] == pytest.approx(0.8) and result.before["val_reward_mean"] == 0.0
    steps = [r for r in result.history if r["kind"] == "train"]
    assert [r["apo/changed"] for r in steps] == [1.0, 1.0] and steps[1]["apo/best_score"] == pytest.approx(0.8)
    assert steps[0]["apo/optimizer_calls"] == 2 and steps[0]["apo/candidates"] == 2


def test_text_only_transitions_feed_the_search(tmp_path, scripted):
    """No engine, no gateway: the agent calls a hosted-model-like endpoint itself and records the call as a span."""
    config = apo_config(tmp_path, scripted.url, steps=1)
    config["rollout"] = {**config["rollout"], "resources": {"hosted_url": scripted.url}}
    result = Trainer(config).fit(agent, tasks(3, "train"), tasks(6, "val"))
    [step] = [r for r in result.history if r["kind"] == "train"]
    assert step["text_only_calls"] == 3 and step["transitions"] == 3 and step["apo/exchanges"] == 3
    [critique] = scripted.asked("critique")
    shown = critique["messages"][1]["content"]
    for i in range(3):  # each low-reward rollout's task and the hosted model's answer, from the text transitions
        assert f"Task: question {i}\nAnswer: reply: question {i}\nReward: 0" in shown
    assert step["apo/best_score"] == pytest.approx(0.8 * 4 / 6)
    assert len(scripted.asked("hosted")) == 3 + 6 + 6 * 3 + 6  # train, before, three candidates, after


def _child(workdir: Path, engine_url: str, optimizer_url: str) -> subprocess.Popen:
    code = (
        "import sys, logging; logging.basicConfig(level=logging.INFO)\n"
        "from pathlib import Path\n"
        "import agl_apo.plugin\n"
        "from agl.plugins import get_plugin_manager, register\n"
        "from agl_trainer.trainer import Trainer\n"
        "from tests.apo.agents import agent, tasks\n"
        "from tests.apo.test_apo import apo_config\n"
        "if not get_plugin_manager().is_registered(agl_apo.plugin):  # installed: its entry point did\n"
        "    register(agl_apo.plugin, name='agl_apo-child')\n"
        f"cfg = apo_config(Path({str(workdir.parent)!r}), {optimizer_url!r}, steps=3, engine_urls=[{engine_url!r}])\n"
        "cfg['val_before'] = False\n"
        "Trainer(cfg).fit(agent, tasks(3, 'train'), tasks(6, 'val'))\n"
    )
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, APO_AGENT_SLEEP="0.2")
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
def test_a_run_killed_mid_search_resumes_with_its_beam(tmp_path, engine, scripted):
    workdir = tmp_path / "run"
    child = _child(workdir, engine.url, scripted.url)
    try:

        def scoring_in_step_2() -> bool:
            assert child.poll() is None, child.stdout.read()
            state = workdir / "trainer_state.json"
            if not state.exists() or json.loads(state.read_text())["completed_step"] != 1:
                return False
            store = SqliteStore(workdir / "agl.db")
            try:
                return any("-score2-" in r.rollout_id for r in store.query_rollouts(status=RolloutStatus.RUNNING))
            finally:
                store.close()

        wait_until(scoring_in_step_2, "step 2 is scoring candidates", 120, step_s=0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        store = SqliteStore(workdir / "agl.db")
        try:
            interrupted = [r.rollout_id for r in store.query_rollouts(status=RolloutStatus.RUNNING)]
            ended = {r.rollout_id: r.ended_at for r in store.query_rollouts() if r.status.terminal}
        finally:
            store.close()
        assert any("-score2-" in rid for rid in interrupted)
        saved = json.loads((workdir / "checkpoints" / "step-1" / "apo_state.json").read_text())
        beam_after_1 = [c["resources"]["system_prompt"] for c in saved["beam"]]
        assert beam_after_1 == ["Be brief and polite.", "Be brief."]

        again = _child(workdir, engine.url, scripted.url)
        out, _ = again.communicate(timeout=180)
        assert again.returncode == 0, out
        assert "resuming run" in out
    finally:
        if child.poll() is None:
            child.kill()
    lines = candidates(workdir)
    assert sorted({c["step"] for c in lines}) == [1, 2, 3]
    per_step = {s: [c["id"] for c in lines if c["step"] == s] for s in (1, 2, 3)}
    assert all(len(ids) == len(set(ids)) for ids in per_step.values())  # the interrupted step's lines once
    step1_best = next(c for c in lines if c["step"] == 1 and c["prompt"] == "Be brief and polite.")
    # the resumed step 2 starts from step 1's beam: its parent is step 1's best, and step 1's beam is rescored
    made_in_2 = [c for c in lines if c["step"] == 2 and c["id"].startswith("s2c")]
    assert len(made_in_2) == 3 and {c["parent"] for c in made_in_2} == {step1_best["id"]}
    assert set(per_step[2]) - {c["id"] for c in made_in_2} == {c["version"] for c in saved["beam"]}
    final = json.loads((workdir / "checkpoints" / "step-3" / "apo_state.json").read_text())
    best = final["beam"][0]
    assert best["resources"]["system_prompt"] == "Be brief, polite and exact." and best["resources"]["few_shot"]
    assert best["score"] == pytest.approx(1.0)
    store = SqliteStore(workdir / "agl.db")
    try:
        step3 = [r for r in store.query_rollouts(step=3) if r.mode == "train"]
        exact = next(c for c in lines if c["step"] == 2 and c["prompt"] == "Be brief, polite and exact.")
        assert {r.resources_version for r in step3} == {exact["id"]}
        scored = [r for r in store.query_rollouts() if "-score" in r.rollout_id]
        assert len({r.rollout_id for r in scored}) == len(scored)
        # the interrupted step's scoring ran again whole under the resume's ids; the killed trainer's
        # running ones were cancelled, never retried
        rerun = [r for r in scored if "-resume1-score2-" in r.rollout_id]
        assert rerun and all(r.status == RolloutStatus.SUCCEEDED for r in rerun)
        for rid in interrupted:
            assert store.get_rollout(rid).status == RolloutStatus.CANCELLED
            attempts = store.attempts(rid)
            assert len(attempts) == 1 and "TrainerRestarted" in attempts[0].error
        # the rollouts that had ended (step 1's, and step 2's scoring done before the kill) were not run again
        assert all(store.get_rollout(rid).ended_at == at for rid, at in ended.items())
    finally:
        store.close()


def test_agl_train_with_backend_apo_from_the_command_line(tmp_path, engine, scripted):
    """``agl train --backend apo``: the installed package's entry point provides the backend by name."""
    import yaml

    config = apo_config(tmp_path, scripted.url, steps=1, engine_urls=[engine.url])
    backend = config.pop("backend")
    (tmp_path / "apo.yaml").write_text(yaml.safe_dump({**config, "backend": {"name": "apo", **backend}}))
    for split, n in (("train", 3), ("val", 6)):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks(n, split)))
    agl_cli = Path(sys.executable).parent / "agl"
    proc = subprocess.run(
        [str(agl_cli), "train", "tests.apo.agents:agent", "--backend", "apo", "--config", str(tmp_path / "apo.yaml")]
        + ["--tasks", str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl")],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = candidates(tmp_path / "run")
    assert {c["prompt"] for c in lines} == {FIRST, "Be brief.", "Be brief and polite."}
