"""`agl export transitions` on a real SqliteStore, as a function and as a command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agl.errors import ConfigError
from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span, Task
from agl_trainer.export import COLUMNS, drop_notes, export_transitions
from agl_trainer.transitions import TransitionConfig

AGL = [sys.executable, "-c", "import sys; from agl_trainer.cli import main; sys.exit(main(sys.argv[1:]))"]


@pytest.fixture
def filled(sqlite_store):
    s = sqlite_store
    s.add_tasks([Task(task_id=f"t{i}", input={"q": i}) for i in range(3)])
    s.enqueue([Rollout(rollout_id=f"r{i}", task_id=f"t{i}", step=1 + (i == 2), model_version="v0") for i in range(3)])
    s.claim("x", limit=3)
    for i in range(3):
        s.add_llm_calls(
            [
                LLMCall(
                    call_id=f"c{i}",
                    rollout_id=f"r{i}",
                    request={"messages": [{"role": "user", "content": f"q{i}"}]},
                    response={"choices": [{"message": {"role": "assistant", "content": f"a{i}"}}]},
                    prompt_ids=[1, 2, i],
                    response_ids=[5, 6],
                    response_logprobs=[-0.5, -0.25],
                    model_version="v0",
                )
            ]
        )
        s.add_spans(
            [
                Span(
                    span_id=f"s{i}",
                    rollout_id=f"r{i}",
                    name="chat",
                    kind="llm",
                    attributes={"gen_ai.response.id": f"c{i}", "gen_ai.agent.name": "writer" if i else "critic"},
                )
            ]
        )
    # r0 also made a call to a hosted model the gateway never saw: a text-only transition.
    s.add_spans(
        [
            Span(
                span_id="hosted",
                rollout_id="r0",
                seq=1,
                name="chat",
                kind="llm",
                attributes={
                    "gen_ai.response.id": "chatcmpl-hosted",
                    "gen_ai.agent.name": "critic",
                    "gen_ai.input.messages": [{"role": "user", "content": "judge"}],
                    "gen_ai.output.messages": [{"role": "assistant", "content": "fine"}],
                },
            )
        ]
    )
    s.add_rewards([Reward(rollout_id=f"r{i}", value=float(i)) for i in range(2)])  # r2 gets none
    for i in range(3):
        s.finish(f"r{i}", RolloutStatus.SUCCEEDED)
    return s


def test_jsonl_export_has_text_ids_and_rewards(filled, tmp_path):
    n, report = export_transitions(filled, tmp_path / "out.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert n == len(rows) == 3 and report.dropped_rollouts == {"no_reward": 1}
    assert all(tuple(r) == COLUMNS for r in rows)
    by_call = {r["call_id"]: r for r in rows}
    c1 = by_call["c1"]
    assert c1["prompt_ids"] == [1, 2, 1] and c1["response_ids"] == [5, 6] and c1["response_logprobs"] == [-0.5, -0.25]
    assert c1["prompt_messages"] == [{"role": "user", "content": "q1"}] and c1["response_text"] == "a1"
    assert (
        c1["reward"] == 1.0 and c1["agent"] == "writer" and c1["rollout_step"] == 1 and c1["token_source"] == "engine"
    )
    hosted = by_call["chatcmpl-hosted"]
    assert hosted["token_source"] == "text" and hosted["prompt_ids"] == [] and hosted["response_logprobs"] is None
    assert hosted["prompt_messages"] == [{"role": "user", "content": "judge"}] and hosted["response_text"] == "fine"


def test_step_agent_and_missing_reward_filters(filled, tmp_path):
    n, _ = export_transitions(filled, tmp_path / "s2.jsonl", step=2, config=TransitionConfig(missing_reward=0.0))
    rows = [json.loads(line) for line in (tmp_path / "s2.jsonl").read_text().splitlines()]
    assert n == 1 and rows[0]["rollout_id"] == "r2" and rows[0]["reward"] == 0.0
    n, _ = export_transitions(filled, tmp_path / "w.jsonl", config=TransitionConfig(agents=["critic"], text_only=False))
    assert n == 1 and json.loads((tmp_path / "w.jsonl").read_text())["call_id"] == "c0"


def test_parquet_export_round_trips(filled, tmp_path):
    import pyarrow.parquet as pq

    n, _ = export_transitions(filled, tmp_path / "out.parquet", batch_rows=2)
    table = pq.read_table(tmp_path / "out.parquet")
    assert n == table.num_rows == 3 and tuple(table.column_names) == COLUMNS
    rows = {r["call_id"]: r for r in table.to_pylist()}
    assert rows["c1"]["prompt_ids"] == [1, 2, 1] and json.loads(rows["c1"]["prompt_messages"]) == [
        {"role": "user", "content": "q1"}
    ]


def test_bad_format_is_a_clear_error(filled, tmp_path):
    with pytest.raises(ConfigError, match="cannot tell the format"):
        export_transitions(filled, tmp_path / "out.csv")


def test_merged_rows_are_refused_naming_the_field(filled, tmp_path):
    with pytest.raises(ConfigError, match="transitions.merge: 'prefix'"):
        export_transitions(filled, tmp_path / "t.jsonl", config=TransitionConfig(merge="prefix"))
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.slow
def test_the_command(filled, tmp_path):
    out = tmp_path / "cli.parquet"
    proc = subprocess.run(
        [
            *AGL,
            "export",
            "transitions",
            "--store",
            f"sqlite:///{filled.path}",
            "--step",
            "1",
            "--agent",
            "writer",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 transitions from 2 rollouts" in proc.stderr and out.exists()
    bad = subprocess.run(
        [*AGL, "export", "transitions", "--store", f"sqlite:///{filled.path}", "-o", str(tmp_path / "x.txt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--format: cannot tell the format" in bad.stderr


def test_drop_notes_say_how_many_why_and_which_flag_keeps_them(filled, tmp_path):
    _, report = export_transitions(filled, tmp_path / "out.jsonl")
    assert drop_notes(report) == [
        "left out 1 rollout (no_reward): succeeded but nobody rewarded them (no agl.emit_reward, "
        "no agl_reward plugin); --missing-reward 0 keeps them with reward 0"
    ]
    _, kept = export_transitions(filled, tmp_path / "all.jsonl", config=TransitionConfig(missing_reward=0.0))
    assert drop_notes(kept) == []


def test_the_command_says_what_it_left_out_and_the_flag_keeps_them(filled, tmp_path):
    store = ["--store", f"sqlite:///{filled.path}"]
    dropped = subprocess.run(
        [*AGL, "export", "transitions", *store, "-o", str(tmp_path / "a.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dropped.returncode == 0, dropped.stderr
    assert "agl export: 3 transitions from 3 rollouts" in dropped.stderr
    assert "agl export: left out 1 rollout (no_reward)" in dropped.stderr
    assert "--missing-reward 0 keeps them" in dropped.stderr
    kept = subprocess.run(
        [*AGL, "export", "transitions", *store, "--missing-reward", "0", "-o", str(tmp_path / "b.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert kept.returncode == 0, kept.stderr
    assert "agl export: 4 transitions from 3 rollouts" in kept.stderr and "left out" not in kept.stderr
    rows = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert {r["rollout_id"]: r["reward"] for r in rows if r["rollout_id"] == "r2"} == {"r2": 0.0}
