"""The examples read the prompts an optimizer chose from their rollout's resources, and nothing changes without.

The calculator agent runs for real (AutoGen, the MCP calculator process) against the scripted model
server (tests/apo/scripted_model.py, a real HTTP server whose answers are a script), which keeps
what the agent sent. The SQL agent's writer messages are read from its prompts module.
"""

from __future__ import annotations

import agl
from agl.capture import BufferedWriter, RolloutContext
from tests.apo.scripted_model import HOSTED


async def test_the_calculator_agent_reads_its_system_prompt_and_examples_from_the_context(scripted, sqlite_store):
    from examples.calc_agent.agent import calc_agent
    from examples.calc_agent.prompts import EXAMPLE_QUESTION, SYSTEM_MESSAGE

    writer = BufferedWriter(sqlite_store, interval_s=0.05)
    chosen = {"system_prompt": "Use the calculate tool.", "few_shot": ["Question: What is 2+2?\nAnswer: ANSWER: 4"]}
    for rollout_id, resources in (("ro-default", {}), ("ro-chosen", chosen)):
        ctx = RolloutContext(rollout_id, base_url=scripted.url, model=HOSTED, resources=resources, writer=writer)
        with agl.use_rollout(ctx):
            output = await calc_agent({"question": "What is 3+3?"}, ctx)
        assert output["answer"] == "reply: What is 3+3?"
    writer.close()
    default, chosen_call = (r["messages"] for r in scripted.asked("hosted"))
    assert default[0] == {"role": "system", "content": SYSTEM_MESSAGE}
    assert [m["content"] for m in default[1:2]] == [EXAMPLE_QUESTION]
    assert chosen_call[0] == {"role": "system", "content": "Use the calculate tool."}
    # the example as a question and its answer, then the worked example, then the problem
    assert chosen_call[1] == {"role": "user", "content": "What is 2+2?", "name": "user"}
    assert chosen_call[2]["role"] == "assistant" and chosen_call[2]["content"] == "ANSWER: 4"
    assert chosen_call[3]["content"] == EXAMPLE_QUESTION and chosen_call[-1]["content"] == "What is 3+3?"


def test_the_sql_writer_reads_its_instructions_and_examples_from_the_rollout():
    from examples.sql_agent import prompts

    default = prompts.writer_messages("How many artists?")
    assert default[0] == ("system", prompts.WRITER_SYSTEM) and len(default) == 2 + 2 * len(prompts.WRITER_EXAMPLES)
    # the optimizer's starting resources give exactly the messages the RL arms use
    with agl.use_rollout(RolloutContext("ro-r0", resources=dict(prompts.DEFAULT_RESOURCES))):
        assert prompts.writer_messages("How many artists?") == default
    chosen = {
        "writer_system": "Write one SQLite query.",
        "few_shot": ["Question: Count genres.\nAnswer: ```sql\nSELECT COUNT(*) FROM Genre\n```"],
    }
    with agl.use_rollout(RolloutContext("ro-chosen", resources=chosen)):
        assert prompts.writer_messages("How many artists?") == [
            ("system", "Write one SQLite query."),
            ("human", "Count genres."),
            ("ai", "```sql\nSELECT COUNT(*) FROM Genre\n```"),
            ("human", "How many artists?"),
        ]
        assert prompts.rewriter_messages("Q", "SELECT 1", "NO")[:3] == writer_messages_head(chosen)
        assert prompts.checker_messages("Q", "SELECT 1")[0] == ("system", prompts.CHECKER_SYSTEM)  # not the writer's


def writer_messages_head(chosen: dict) -> list[tuple[str, str]]:
    return [
        ("system", chosen["writer_system"]),
        ("human", "Count genres."),
        ("ai", chosen["few_shot"][0].split("\nAnswer: ")[1]),
    ]


def test_concurrent_sql_rollouts_each_write_with_their_own_resources(scripted, sqlite_store):
    """Through the runner, two at once: LangGraph's nodes see their own rollout's resources, not the other's."""
    from agl.runner import Runner
    from agl.schema import Rollout, Task
    from examples.sql_agent.agent import sql_agent

    sqlite_store.add_tasks([Task(task_id=k, input={"question": f"Question {k}?"}) for k in "ab"])
    sqlite_store.enqueue(
        [
            Rollout(
                rollout_id=f"ro-{k}", task_id=k, resources={"writer_system": f"Write SQL {k}."}, resources_version=k
            )
            for k in "ab"
        ]
    )
    gateway_like = scripted.url.removesuffix("/v1")  # it answers every route: /rollouts/<id>/v1/chat/completions too
    runner = Runner(sql_agent, sqlite_store, gateway_url=gateway_like, model=HOSTED, concurrency=2)
    try:
        counts = runner.run_sync(until_idle=True)
    finally:
        runner.close()
    assert counts.get("succeeded") == 2, counts
    writes = [r["messages"] for r in scripted.asked("hosted") if r["messages"][0]["content"].startswith("Write SQL")]
    assert writes and {(m[0]["content"], m[-1]["content"].split("\n")[0]) for m in writes} == {
        ("Write SQL a.", "Question a?"),
        ("Write SQL b.", "Question b?"),
    }


def test_agl_run_points_a_program_at_its_prompt_in_a_file(tmp_path):
    """No agl line in the program: its prompt lives in a file, and agl run hands it the rollout's as one."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from agl.schema import Rollout, Task
    from agl.store.sqlite import SqliteStore

    program = tmp_path / "agent.py"
    program.write_text(
        "import argparse, json, os\n"
        "p = argparse.ArgumentParser(); p.add_argument('--prompt-file'); p.add_argument('out')\n"
        "args = p.parse_args()\n"
        "folder = os.path.dirname(args.prompt_file)\n"
        "seen = {'prompt': open(args.prompt_file).read(), 'files': sorted(os.listdir(folder)), 'folder': folder}\n"
        "seen['few_shot'] = json.load(open(os.path.join(folder, 'few_shot.json')))\n"
        "json.dump(seen, open(args.out, 'w'))\n"
    )
    db = tmp_path / "agl.db"
    store = SqliteStore(db)
    resources = {"system_prompt": "Be brief, polite and exact.", "few_shot": ["Question: a\nAnswer: b"]}
    try:
        store.add_tasks([Task(task_id="t", input={"question": "q"})])
        store.enqueue([Rollout(rollout_id="ro-file", task_id="t", resources=resources, resources_version="s1c1")])
    finally:
        store.close()
    out = tmp_path / "seen.json"
    command = f'{sys.executable} {program} --prompt-file "$AGL_RESOURCES_DIR/system_prompt.txt" {out}'
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    agl_cli = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
    done = subprocess.run(
        [*agl_cli, "run", "--store", f"sqlite:///{db}", "--", "sh", "-c", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(out.read_text())
    assert seen["prompt"] == "Be brief, polite and exact." and seen["few_shot"] == resources["few_shot"]
    assert seen["files"] == ["few_shot.json", "system_prompt.txt"]
    assert f"AGL_RESOURCES_DIR={seen['folder']}" in done.stderr
    assert not os.path.exists(seen["folder"])  # removed when the program ended
