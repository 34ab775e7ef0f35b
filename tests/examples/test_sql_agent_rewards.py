"""The SQL agent's reward plugin, its database access, its parsing and its data."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.examples.modules import example_modules

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def sql():
    return example_modules("sql_agent", "database", "prompts", "questions", "report", "rewards")


def rollout(output, gold: str, ordered: bool = False):
    return SimpleNamespace(output=output, task=SimpleNamespace(input={"gold_sql": gold, "ordered": ordered}))


GOLD = "SELECT Name FROM Artist WHERE ArtistId = 1"


def test_right_query_scores_one(sql):
    out = {"sql": "SELECT a.Name FROM Artist AS a WHERE a.ArtistId = 1"}
    assert sql.rewards.agl_reward(rollout(out, GOLD), [], [], []) == 1.0


def test_wrong_query_scores_zero(sql):
    assert (
        sql.rewards.agl_reward(rollout({"sql": "SELECT Name FROM Artist WHERE ArtistId = 2"}, GOLD), [], [], []) == 0.0
    )
    # the right rows plus a column too many is not the same result
    extra = {"sql": "SELECT Name, ArtistId FROM Artist WHERE ArtistId = 1"}
    assert sql.rewards.agl_reward(rollout(extra, GOLD), [], [], []) == 0.0


@pytest.mark.parametrize(
    "output",
    [
        {"sql": "SELEC Name FROM Artist"},
        {"sql": "SELECT Nme FROM Artist"},
        {"sql": ""},
        {"sql": None},
        {"sql": "DELETE FROM Artist"},
        {"sql": "SELECT 1; DROP TABLE Artist"},
        {},
        None,
        42,
    ],
)
def test_malformed_or_missing_query_scores_zero(sql, output):
    assert sql.rewards.agl_reward(rollout(output, GOLD), [], [], []) == 0.0


def test_slow_query_scores_zero_within_the_time_limit(sql):
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    started = time.monotonic()
    assert sql.rewards.agl_reward(rollout({"sql": runaway}, GOLD), [], [], []) == 0.0
    elapsed = time.monotonic() - started
    assert elapsed < sql.database.TIMEOUT_S + 2.0, elapsed
    result = sql.database.run_query(runaway, timeout_s=0.3)
    assert not result.ok and "timed out" in result.error


def test_order_matters_only_when_the_question_orders(sql):
    gold = "SELECT Name FROM Genre WHERE GenreId IN (1, 2, 3) ORDER BY Name"
    backwards = {"sql": "SELECT Name FROM Genre WHERE GenreId IN (1, 2, 3) ORDER BY Name DESC"}
    assert sql.rewards.agl_reward(rollout(backwards, gold, ordered=False), [], [], []) == 1.0
    assert sql.rewards.agl_reward(rollout(backwards, gold, ordered=True), [], [], []) == 0.0


def test_numbers_compare_rounded(sql):
    gold = "SELECT SUM(Total) FROM Invoice WHERE BillingCountry = 'France'"
    assert sql.rewards.execution_match("SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE BillingCountry = 'France'", gold)
    assert not sql.rewards.execution_match("SELECT SUM(Total) + 1 FROM Invoice WHERE BillingCountry = 'France'", gold)


def test_the_database_is_read_only_and_rows_are_capped(sql):
    before = sql.database.db_path().stat().st_mtime
    result = sql.database.run_query("UPDATE Artist SET Name = 'x' WHERE ArtistId = 1")
    assert not result.ok and "readonly" in result.error
    capped = sql.database.run_query("SELECT * FROM Track", max_rows=10)
    assert capped.ok and len(capped.rows) == 10 and capped.truncated
    assert sql.database.db_path().stat().st_mtime == before


def test_the_database_path_can_be_overridden(sql, monkeypatch, tmp_path):
    monkeypatch.setenv(sql.database.DB_ENV, str(tmp_path / "missing.db"))
    with pytest.raises(FileNotFoundError, match="SQL_AGENT_DB"):
        sql.database.db_path()
    assert not sql.database.run_query("SELECT 1").ok
    # without a database no answer can be scored: an error that says why, not a reward of 0
    with pytest.raises(sql.rewards.GoldQueryError, match="SQL_AGENT_DB"):
        sql.rewards.execution_match("SELECT 40 + 2", "SELECT 42 -- never cached")


def test_a_gold_query_that_does_not_run_is_an_error_not_a_zero(sql):
    with pytest.raises(sql.rewards.GoldQueryError, match="no such table: Nope"):
        sql.rewards.execution_match("SELECT 1", "SELECT * FROM Nope")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("```sql\nSELECT Name FROM Artist\n```", "SELECT Name FROM Artist"),
        ("Here it is:\n```sql\nSELECT Name FROM Artist;\n```\nMore text", "SELECT Name FROM Artist"),
        ("```sql\nSELECT Name FROM Artist WHERE", "SELECT Name FROM Artist WHERE"),
        ("The query is SELECT COUNT(*) FROM Track; done", "SELECT COUNT(*) FROM Track"),
        ("The album is called Let There Be Rock.", ""),
    ],
)
def test_the_sql_is_read_from_the_answer_text(sql, answer, expected):
    assert sql.prompts.extract_sql(answer) == expected


def test_the_checker_verdict(sql):
    assert sql.prompts.accepted("YES")
    assert sql.prompts.accepted(" yes, it does")
    assert not sql.prompts.accepted("NO, the column is wrong")
    assert not sql.prompts.accepted("The answer is yes")


def test_the_data_is_reproducible_and_committed(sql):
    generated = sql.questions.generate()
    for split, tasks in generated.items():
        committed = [json.loads(line) for line in (EXAMPLES / "sql_agent" / "data" / f"{split}.jsonl").open()]
        assert committed == json.loads(json.dumps(tasks)), split
    easy = [json.loads(line) for line in (EXAMPLES / "sql_agent" / "data" / "train-easy.jsonl").open()]
    assert easy == sql.questions.of_tiers(json.loads(json.dumps(generated["train"])), ("easy",))
    assert len(easy) == sql.questions.SIZES["train"]


def test_the_splits_have_tiers_and_hold_out_entities(sql):
    splits = sql.questions.generate()
    assert sum(len(t) for t in splits.values()) >= 300
    for split, tasks in splits.items():
        tiers = [t["input"]["tier"] for t in tasks]
        assert {tier: tiers.count(tier) for tier in sql.questions.TIERS} == dict.fromkeys(
            sql.questions.TIERS, sql.questions.SIZES[split]
        )
    pools = sql.questions.split_entities(sql.questions._entities(sql.database.connect()))
    for kind in pools["train"]:
        train = {json.dumps(e, sort_keys=True) for e in pools["train"][kind]}
        for held_out in ("val", "test"):
            assert not train & {json.dumps(e, sort_keys=True) for e in pools[held_out][kind]}, kind
    # every gold query of every split runs and returns rows
    for tasks in splits.values():
        for task in tasks:
            assert sql.rewards.gold_rows(task["input"]["gold_sql"]), task


def checker_figures(checks, acceptance, accuracy, of_right, of_wrong):
    names = ("checks", "acceptance", "accuracy", "acceptance_of_right", "acceptance_of_wrong")
    return dict(zip(names, (checks, acceptance, accuracy, of_right, of_wrong), strict=True))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_report_is_built_from_the_results_files(sql, tmp_path):
    def record(arm, seed, after, checker=None):
        """A results file; ``checker``: the checker's figures ``(before, after)``, absent from older files."""
        tiers = {"easy": after * 3, "medium": 0.0, "hard": 0.0}
        figures = {"success_by_tier": tiers, "rewrites_per_question": 1.0, "checker_acceptance": 0.25}
        before, after_figures = ({"checker": c} for c in checker) if checker else ({}, {})
        return {
            "arm": arm,
            "seed": seed,
            "steps": 6,
            "wall_s": 1500.0 + 60 * seed,
            "transitions_config": {"credit": "discounted", "agents": ["write_query", "rewrite_query"]},
            "before": {**figures, **before, "success": 0.0},
            "after": {**figures, **after_figures, "success": after},
            "train_agent_calls": {"write_query": 96, "check_query": 180},
            "trained_transitions": {"write_query": 96},
            "train_success_by_step": [0.0, 0.25, 0.5, 0.0, 0.0, 0.25 * seed],
        }

    results = tmp_path / "results"
    (results / "base").mkdir(parents=True)
    (results / "base" / "test.json").write_text("{}")  # the shared base figures are not a run
    (results / "apo-both-seed0.json").write_text(json.dumps({"arm": "both", "seed": 0}))  # prompt optimization's
    for seed, after in ((1, 0.1), (0, 0.2)):
        (results / f"main-seed{seed}.json").write_text(json.dumps(record("main", seed, after)))
    assert "checker right" not in sql.report.render(sql.report.load(results))  # no file has the figures yet
    base_checker = checker_figures(160, 0.25, 0.65, 0.5, 0.2)
    per_role = {0: (0.3, checker_figures(150, 0.2, 0.7, 0.5, 0.1)), 1: (0.1, checker_figures(170, 0.3, 0.8, None, 0.2))}
    for seed, (after, figures) in per_role.items():
        (results / f"per-role-seed{seed}.json").write_text(
            json.dumps(record("per-role", seed, after, (base_checker, figures)))
        )
    page = tmp_path / "results-page.md"
    from examples.reporting import END, START

    page.write_text(f"intro\n{START}\nold\n{END}\noutro\n")

    assert sql.report.main(["--results", str(results), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    lines = text.splitlines()
    row, behaviour, checker = [line for line in lines if line.startswith("| main |")]
    assert lines.index(row) - 1 == next(i for i, line in enumerate(lines) if line.startswith("| per-role |"))
    # test success and the checker per seed: mean ± std (seed 0, seed 1); a seed without right queries has n/a
    assert cells(lines[lines.index(checker) - 1]) == [
        "per-role",
        sql.report.ARM_LABELS["per-role"],
        "20.0 ± 14.1 (30.0, 10.0)",
        "160 ± 14 (150, 170)",
        "25.0 ± 0.0 (25.0, 25.0)",
        "25.0 ± 7.1 (20.0, 30.0)",
        "65.0 ± 0.0 (65.0, 65.0)",
        "75.0 ± 7.1 (70.0, 80.0)",
        "50.0 (50.0, n/a)",
        "15.0 ± 7.1 (10.0, 20.0)",
    ]
    # the results files from before the checker's figures were kept: n/a, never a crash; the acceptance
    # is their checker_acceptance (the same count: verdicts YES over checks)
    accepted = "25.0 ± 0.0 (25.0, 25.0)"
    assert cells(checker)[2:] == ["15.0 ± 7.1 (20.0, 10.0)", "n/a", accepted, accepted, *["n/a"] * 4]
    assert "check_query 180, write_query 96" in behaviour
    assert cells(row)[3:7] == ["0, 1", "6", "0.0 ± 0.0", "15.0 ± 7.1"]  # seeds in order; after: mean ± sample std
    assert cells(row)[-3:-1] == ["25.0 ± 0.0", "4.2 ± 5.9"]  # training success over steps 1-3, then 4-6
    assert cells(row)[-1] == "25.5 ± 0.7"  # minutes


def test_the_report_compares_the_questions_each_arm_solved_with_the_main_arms(sql):
    def record(arm, seed, solved):
        return {"arm": arm, "seed": seed, "after": {"solved": solved}}

    arms = {
        "main": [record("main", 0, ["q1", "q2", "q3"]), record("main", 1, ["q1"])],
        "broadcast": [record("broadcast", 0, ["q1", "q2", "q3"]), record("broadcast", 2, ["q9"])],
        "all-agents": [record("all-agents", 0, ["q2", "q4"]), record("all-agents", 1, ["q1"])],
    }

    rows = sql.report.solved_table(arms)[2:]

    # (arm, seed, both, only main, only the arm); broadcast seed 2 has no main run to compare with
    assert rows == ["| broadcast | 0 | 3 | 0 | 0 |", "| all-agents | 0 | 1 | 2 | 1 |", "| all-agents | 1 | 1 | 0 | 0 |"]
    assert sql.report.solved_table({"main": arms["main"]}) == []


def test_a_summary_counts_successes_and_final_queries_that_run(sql):
    from agl.schema import Rollout, RolloutStatus
    from examples.sql_agent.evaluation import summarize

    tasks = {f"t{i}": {"gold_sql": GOLD, "tier": "easy"} for i in range(4)}
    outputs = [
        {"sql": GOLD, "rounds": 1, "accepted": True},
        {"sql": "SELECT Name FROM Artist WHERE ArtistId = 2", "rounds": 2, "rewrites": 1},  # runs, wrong rows
        {"sql": "SELECT Name FROM Artists", "rounds": 3, "rewrites": 2},  # no such table
        None,  # the rollout failed
    ]
    rollouts = [
        Rollout(task_id=f"t{i}", status=RolloutStatus.SUCCEEDED if out else RolloutStatus.FAILED, output=out)
        for i, out in enumerate(outputs)
    ]

    summary = summarize(rollouts, tasks)

    assert summary["success"] == 0.25 and summary["success_by_tier"]["easy"] == 0.25
    assert summary["solved"] == ["t0"]
    assert summary["final_query_runs"] == 0.5
    assert summary["rewrites_per_question"] == 0.75 and summary["checker_acceptance"] == 1 / 6
    assert summary["statuses"] == {"succeeded": 3, "failed": 1}


def test_a_summary_with_the_store_counts_the_writers_one_line_queries(sql, tmp_path):
    from agl.schema import Rollout, RolloutStatus, Span
    from agl.store.base import open_store
    from examples.sql_agent.evaluation import summarize

    answers = {
        "write_query": ["```sql\nSELECT Name FROM Artist", "```sql\nSELECT Name\nFROM Artist", "Artists are bands."],
        "rewrite_query": ["```sql\nSELECT Name FROM Artist"],  # not the writer's
    }
    store = open_store(f"sqlite:///{tmp_path / 'agl.db'}")
    try:
        store.add_spans(
            Span(
                rollout_id="ro-1",
                name="ChatOpenAI",
                kind="llm",
                seq=i,
                attributes={"gen_ai.agent.name": agent, "gen_ai.output.messages": [{"content": text}]},
            )
            for agent, texts in answers.items()
            for i, text in enumerate(texts)
        )
        rollout = Rollout(rollout_id="ro-1", task_id="t", status=RolloutStatus.SUCCEEDED, output={"sql": GOLD})
        summary = summarize([rollout], {"t": {"gold_sql": GOLD, "tier": "easy"}}, store)
    finally:
        store.close()

    assert summary["agent_calls"] == {"rewrite_query": 1, "write_query": 3}
    assert summary["writer_one_line"] == 1 / 3  # the multi-line query and the prose are not


def test_writer_samples_shows_the_writer_its_messages_with_as_many_examples_as_asked(sql):
    from examples.sql_agent import writer_samples as samples

    question = "How many customers are from Italy?"
    for n in (1, len(sql.prompts.WRITER_EXAMPLES)):
        messages = samples.chat(question, n)
        assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * n, "user"]
        assert messages[-1]["content"] == question and messages[0]["content"] == sql.prompts.WRITER_SYSTEM
    shown = [m["content"] for m in samples.chat(question, len(sql.prompts.WRITER_EXAMPLES))]
    assert shown == [content for _role, content in sql.prompts.writer_messages(question)]
    right = "SELECT COUNT(*) FROM Customer WHERE Country = 'Italy'"
    assert samples.score(f"```sql\n{right}\n```\nmore", {"gold_sql": right, "ordered": False}) == 1.0
    assert samples.score("```sql\nSELECT 2\n```", {"gold_sql": right, "ordered": False}) == 0.0
