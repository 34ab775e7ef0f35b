"""The calculator agent's data, its answer parsing, its reward plugin and its tool-call figures."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.examples.modules import example_modules

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def calc():
    return example_modules("calc_agent", "config", "evaluation", "problems", "prompts", "rewards", "tool_calls")


def rollout(output, answer=27838):
    return SimpleNamespace(output=output, task=SimpleNamespace(input={"answer": answer}))


# -- data -----------------------------------------------------------------------------------


def test_the_data_is_reproducible_and_committed(calc):
    generated = calc.problems.generate()
    for split, tasks in generated.items():
        committed = calc.problems.load_split(split)
        assert committed == json.loads(json.dumps(tasks)), split
    two_operations = calc.problems.of_operations(generated["train"], (2,))
    assert calc.problems.load_split("train-2op") == json.loads(json.dumps(two_operations))
    assert {t["input"]["operations"] for t in two_operations} == {2} and len(two_operations) > 100
    with pytest.raises(ValueError, match="operations: \\[5\\]"):
        calc.problems.of_operations(generated["train"], (2, 5))
    assert calc.problems.generate() == generated
    assert calc.problems.generate(seed=calc.problems.SEED + 1)["test"] != generated["test"]


def test_the_splits_are_disjoint_and_sized(calc):
    splits = calc.problems.generate()
    questions = {split: {t["input"]["question"] for t in tasks} for split, tasks in splits.items()}
    for split, tasks in splits.items():
        assert len(tasks) == len(questions[split]) == calc.problems.SIZES[split]
    assert not questions["train"] & questions["val"]
    assert not questions["train"] & questions["test"]
    assert not questions["val"] & questions["test"]


def test_every_problem_has_2_to_4_operations_on_large_numbers_and_an_exact_answer(calc):
    import ast
    import re

    for tasks in calc.problems.generate().values():
        for task in tasks:
            problem = task["input"]
            expression = problem["expression"]
            tree = ast.parse(expression, mode="eval")
            operators = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp)]
            assert 2 <= problem["operations"] == len(operators) <= 4, problem
            # the expression evaluates exactly to the answer (division is exact)
            assert eval(compile(tree, "<expr>", "eval")) == problem["answer"], problem  # noqa: S307
            assert isinstance(problem["answer"], int) and problem["answer"] > 0
            # the numbers of the expression are the numbers of the question, the first one 4 digits
            numbers = re.findall(r"\d+", expression)
            assert numbers == re.findall(r"\d+", problem["question"]), problem
            assert len(numbers[0]) == 4


# -- answer parsing and reward ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("ANSWER: 27838", 27838.0),
        ("The result is 27838.\nANSWER: 27,838", 27838.0),
        ("answer = 27838.0", 27838.0),
        ("ANSWER: **27838**", 27838.0),
        ("ANSWER: 12\nANSWER: -3.5", -3.5),
        ("ANSWER: 1e3", 1000.0),
    ],
)
def test_the_answer_is_read_after_the_marker(calc, reply, expected):
    assert calc.prompts.parse_answer(reply) == expected


@pytest.mark.parametrize(
    "reply",
    ["27838", "The answer is 27838", "ANSWER:", "ANSWER: many", "ANSWER: 1e999", "", None, 27838, ["ANSWER: 1"]],
)
def test_no_answer_marker_or_number_parses_to_none(calc, reply):
    assert calc.prompts.parse_answer(reply) is None


def test_the_right_answer_scores_one(calc):
    assert calc.rewards.agl_reward(rollout({"answer": "ANSWER: 27838"})) == 1.0
    assert calc.rewards.agl_reward(rollout("ANSWER: 27838")) == 1.0  # a bare string is taken as the reply


def test_within_tolerance_scores_one_and_beyond_scores_zero(calc):
    tolerance = calc.rewards.TOLERANCE
    answer = 7_171_208
    inside, outside = answer + tolerance / 2, answer - tolerance * 2
    assert calc.rewards.numeric_match(f"ANSWER: {inside}", answer) == 1.0
    assert calc.rewards.numeric_match(f"ANSWER: {outside}", answer) == 0.0
    assert calc.rewards.numeric_match("ANSWER: 7171207.999999999", answer) == 1.0  # float noise
    assert calc.rewards.numeric_match("ANSWER: 7171209", answer) == 0.0  # off by one is wrong


@pytest.mark.parametrize(
    "output",
    [
        {"answer": "27838"},  # the right number without the format the prompt asks for
        {"answer": "ANSWER: 27837"},
        {"answer": '<tool_call>\n{"name": "calculate"'},
        {"answer": None},
        {"answer": ["ANSWER: 27838"]},
        {},
        None,
        42,
    ],
)
def test_wrong_or_malformed_output_scores_zero(calc, output):
    assert calc.rewards.agl_reward(rollout(output)) == 0.0


@pytest.mark.parametrize("answer", [None, "27838", True, float("nan")])
def test_a_task_without_a_numeric_answer_scores_zero(calc, answer):
    assert calc.rewards.agl_reward(rollout({"answer": "ANSWER: 27838"}, answer=answer)) == 0.0


def test_the_reward_plugin_registers_as_a_user_registers_one(calc):
    import agl
    from agl.plugins import get_plugin_manager, reward_answers

    name = "calc-test-numeric-match"
    agl.register_plugin(calc.rewards, name=name)
    try:
        results = reward_answers(rollout=rollout({"answer": "ANSWER: 27838"}), spans=[], llm_calls=[], rewards=[])
        assert [(r.plugin, r.value, r.error) for r in results if r.plugin == name] == [(name, 1.0, None)]
    finally:
        agl.plugins.unregister(calc.rewards)
    assert get_plugin_manager().get_plugin(name) is None


# -- tool-call figures --------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {}}}]


def record(content=None, tool_calls=None, tools=TOOLS, tool_choice=None):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": "calculate", "arguments": a}}
            for i, a in enumerate(tool_calls)
        ]
    request = {"messages": [], "tools": tools}
    if tool_choice:
        request["tool_choice"] = tool_choice
    return SimpleNamespace(request=request, response={"choices": [{"message": message}]})


def test_tool_calls_are_classified_from_the_gateway_records(calc):
    calls = [
        record(tool_calls=['{"expression": "1 + 2"}']),
        record(tool_calls=['{"expression": "1 + 2"}', '{"expression": "3 * 4"}']),
        record(tool_calls=['{"expression": 3}']),  # wrong argument type
        record(tool_calls=['{"expr": "1 + 2"}']),  # wrong argument name
        record(content='<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 +'),  # unparseable
        record(content="ANSWER: 3"),  # text
        record(content="ANSWER: 3", tools=None),  # the reflection call: no tools offered, not counted
        record(content="ANSWER: 3", tool_choice="none"),  # tools listed but switched off: not counted
    ]
    figures = calc.tool_calls.tool_call_figures(calls, episodes=4)
    assert figures["tool_offering_calls"] == 6
    assert figures["tool_call_kinds"] == {"valid": 2, "bad_arguments": 2, "malformed": 1, "no_call": 1}
    assert figures["tool_call_validity"] == pytest.approx(2 / 6)
    assert figures["tool_calls_per_episode"] == pytest.approx(5 / 4)


def test_tool_call_figures_of_nothing(calc):
    figures = calc.tool_calls.tool_call_figures([], episodes=0)
    assert figures["tool_call_validity"] is None and figures["tool_calls_per_episode"] is None


# -- sampled evaluation ---------------------------------------------------------------------


def test_a_sampled_summary_counts_the_problems_a_grpo_group_would_learn_from(calc):
    from agl.schema import Rollout, RolloutStatus
    from examples.calc_agent.evaluation import summarize
    from examples.sampling import item_id

    problems = {"calc-val-000": 100, "calc-val-001": 200}
    tasks = {
        f"{pid}#sample{k}": {"answer": answer, "operations": 2} for pid, answer in problems.items() for k in range(3)
    }
    answers = {"calc-val-000#sample1": "ANSWER: 100"}  # one success, on the first problem only
    rollouts = [
        Rollout(task_id=tid, status=RolloutStatus.SUCCEEDED, output={"answer": answers.get(tid, "ANSWER: 7")})
        for tid in tasks
    ]

    summary = summarize(rollouts, tasks)

    assert item_id("calc-val-000#sample1") == "calc-val-000" and item_id("calc-val-000") == "calc-val-000"
    assert summary["success"] == 1 / 6
    assert summary["problems_with_a_success"] == 0.5
    assert "problems_with_a_success" not in summarize(rollouts[:1] + rollouts[3:4], tasks)  # one run per problem


# -- the results page's table -------------------------------------------------------------


def test_the_report_is_built_from_the_results_files(calc, tmp_path):
    from examples.calc_agent import report, spec
    from examples.reporting import END, START, markers

    def figures(success, two, validity):
        return {
            "success": success,
            "success_by_operations": {"2": two, "3": 0.0, "4": 0.0},
            "tool_call_validity": validity,
            "tool_calls_per_episode": validity,
        }

    def record(seed, after, lr=1e-3, steps_without_signal="step", **extra):
        return {
            "name": spec.arm(lr, steps_without_signal, extra.get("max_staleness", 0)),
            "seed": seed,
            "lr": lr,
            "steps_without_signal": steps_without_signal,
            "steps": 10,
            "batch_size": 3,
            "n_rollouts": 8,
            "eval_problems": 60,
            "wall_s": 1200.0 + 120 * seed,
            "step_s_mean": 60.0 + 10 * seed,
            "before": figures(0.0, 0.0, 0.98),
            "after": figures(after, 4 * after, 1.0),
            "train_success_by_step": [0.0, 0.1, 0.2, 0.3],
            "train_tool_calls": {"tool_call_validity": 0.9},
            **extra,
        }

    results = tmp_path / "results"
    (results / "base").mkdir(parents=True)
    (results / "base" / "test.json").write_text("{}")  # the shared base figures are not a run

    def save(folder, run):  # as train.py names its results file
        (folder / f"{run['name']}-seed{run['seed']}.json").write_text(json.dumps(run))

    for seed, after in ((1, 0.1), (0, 0.05)):
        save(results, record(seed, after))
    save(results, record(0, 0.2, lr=3e-4))
    save(results, record(0, 0.15, steps_without_signal="skip"))
    save(results, record(0, 0.1, lr=3e-4, max_staleness=1))  # asynchronous steps
    save(results, {**record(0, 0.1, lr=3e-4), "name": "calc_agent-production-graded0.5", "graded": 0.5})
    # The lr's choice on validation: the runs' records, each adapter's val summary beside it.
    choice = results / "lr-choice"
    choice.mkdir()
    for seed, lr, val_success in ((0, 1e-3, 0.05), (1, 1e-3, 0.0), (0, 3e-4, 0.1), (1, 3e-4, 0.05), (2, 3e-4, None)):
        run = record(seed, 0.1, lr=lr)
        save(choice, run)
        if val_success is not None:  # seed 2 at 3e-4 is trained, not yet evaluated on val
            val = figures(val_success, 4 * val_success, 1.0)
            (choice / f"val-{run['name']}-seed{seed}.json").write_text(json.dumps(val))
    (choice / "val-base.json").write_text(json.dumps(figures(0.0, 0.0, 0.95)))
    lr_start, lr_end = markers("lr-choice")
    page = tmp_path / "results-page.md"
    page.write_text(f"intro\n{START}\nold\n{END}\nmiddle\n{lr_start}\nold\n{lr_end}\noutro\n")

    assert report.main(["--results", str(results), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    results_block, lr_block = text.split("middle")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lr_block.splitlines() if line.startswith("| ")]
    base, *runs = rows[1:]
    assert base[:3] == ["base model", "", "0.0"] and base[4] == "95.0"
    assert [r[:3] for r in runs] == [
        ["0.0003", "0", "10.0"],
        ["0.0003", "1", "5.0"],
        ["0.0003", "**mean ± std**", "7.5 ± 3.5"],  # over the evaluated seeds, named below the table
        ["0.001", "0", "5.0"],
        ["0.001", "1", "0.0"],
        ["0.001", "**mean ± std**", "2.5 ± 3.5"],
    ]
    assert f"not yet evaluated on val (no val-{spec.arm(3e-4, 'step')}-seed2.json)" in lr_block
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in results_block.splitlines() if r.startswith("| ")]
    # the config's lr (3e-4) first; at one lr, skipping after; then asynchronous runs, then recorded traffic
    other_lr, seed0, seed1, mean, skip, asynchronous, recorded = rows[1:]
    assert asynchronous[:2] == ["0.0003, async k=1", "0"] and recorded[0] == "0.0003, recorded traffic 50% graded"
    assert seed0[:3] == ["0.001", "0", "0.0"] and (seed0[3], seed0[5]) == ("5.0", "20.0")  # after; on 2 operations
    assert seed1[1] == "1" and other_lr[:2] == ["0.0003", "0"] and other_lr[3] == "20.0"  # a row per seed, by arm
    assert skip[:2] == ["0.001, skip", "0"] and skip[3] == "15.0"
    assert mean[1] == "**mean ± std**" and mean[3] == "7.5 ± 3.5" and mean[5] == "30.0 ± 14.1"
    # training halves, validity, seconds a step, minutes
    assert mean[12:] == ["5.0 ± 0.0", "25.0 ± 0.0", "90.0 ± 0.0", "65 ± 7", "21.0 ± 1.4"]
    for unmarked in ("no markers\n", f"{START}\nold\n{END}\n"):  # the second lacks the lr-choice block
        (tmp_path / "unmarked.md").write_text(unmarked)
        assert report.main(["--results", str(results), "--page", str(tmp_path / "unmarked.md")]) == 1
        assert (tmp_path / "unmarked.md").read_text() == unmarked


def test_train_py_names_its_arm_by_what_differs_from_the_config(calc):
    from examples.calc_agent import spec
    from examples.calc_agent.curriculum import Curriculum

    lr = calc.config.LR
    assert spec.arm(lr, "step") == "calc_agent"
    assert spec.arm(1e-3, "step") == "calc_agent-lr0.001"
    assert spec.arm(lr, "skip") == "calc_agent-skip"
    assert spec.arm(lr, "step", 1, 60) == "calc_agent-async1-steps60"
    assert spec.arm(lr, "step", 0, 60, Curriculum(31, (2, 3))) == "calc_agent-ops2-3from31-steps60"
    assert spec.arm(lr, "step", 0, 60, None, True) == "calc_agent-filter-steps60"
    assert spec.arm(lr, "step", 0, 30, None, False, 0.5, (4, 2, 3)) == "calc_agent-operands0.5-ops2-3-4-steps30"
    assert spec.arm(lr, "step", 0, 10, None, False, 0.0, (2,)) == "calc_agent"
    config = calc.config.trainer_config(seed=0, workdir=Path("w"), model_path="m", steps_without_signal="skip")
    assert config["backend"]["config"]["steps_without_signal"] == "skip"
    assert "steps_without_signal" not in calc.config.trainer_config(seed=0, workdir=Path("w"), model_path="m")


def test_a_curriculum_orders_the_training_problems_by_stage(calc):
    import argparse

    from examples.calc_agent.curriculum import Curriculum

    curriculum = Curriculum.parse("3:3,2")
    assert curriculum == Curriculum(3, (2, 3))
    first = calc.problems.of_operations(calc.problems.load_split("train"), (2,))
    order = curriculum.order(first, steps=40, batch_size=3, seed=1)
    assert len(order) == 40 * 3
    assert {t["input"]["operations"] for t in order[:6]} == {2}  # steps 1 and 2: the first stage's
    assert {t["input"]["operations"] for t in order[6:]} == {2, 3}  # from step 3 on: two and three operations
    later = calc.problems.of_operations(calc.problems.load_split("train"), (2, 3))
    assert len(order[6:]) < len(later) and len({t["task_id"] for t in order[6:]}) == len(order[6:])  # no repeat
    one_epoch = Curriculum(2, (2, 3)).order(first, steps=2, batch_size=len(first), seed=1)[: len(first)]
    assert sorted(t["task_id"] for t in one_epoch) == sorted(t["task_id"] for t in first)  # each problem once
    assert curriculum.order(first, steps=40, batch_size=3, seed=1) == order  # seeded
    assert curriculum.order(first, steps=40, batch_size=3, seed=2) != order
    for bad, reason in (("31", "STEP:OPERATIONS"), ("x:2", "STEP:OPERATIONS"), ("1:2,3", "step 2 or later")):
        with pytest.raises(argparse.ArgumentTypeError, match=reason):
            Curriculum.parse(bad)
    with pytest.raises(ValueError, match="starts at step 41, after the last"):
        Curriculum(41, (2, 3)).order(first, steps=40, batch_size=3, seed=1)


def test_train_refuses_a_curriculum_that_starts_after_the_last_step(capsys):
    from examples.calc_agent import train

    with pytest.raises(SystemExit) as exit_:
        train.main(["--steps", "10", "--curriculum", "11:2,3"])
    assert exit_.value.code == 2
    assert "curriculum: its second stage starts at step 11, after the last (10)" in capsys.readouterr().err


def test_train_refuses_a_curriculum_with_filter_groups(capsys):
    """The curriculum orders the problems by step; a filtered step may take several batches of them."""
    from examples.calc_agent import train

    with pytest.raises(SystemExit) as exit_:
        train.main(["--steps", "10", "--curriculum", "5:2,3", "--filter-groups"])
    assert exit_.value.code == 2
    assert "--curriculum: cannot be used with --filter-groups" in capsys.readouterr().err


def test_operand_credit_ranks_wrong_answers_by_how_many_of_the_problems_numbers_they_use(calc):
    credit = calc.rewards.OperandCredit(0.5)

    def reward(expression, answer="1") -> float:
        call = {"name": "calculate", "arguments": json.dumps({"expression": expression})}
        output = {"answer": f"ANSWER: {answer}", "tool_calls": [call]}
        task = {"answer": 4338, "expression": "6194 - 1528 + 1312 - 1640"}
        return credit.agl_reward(SimpleNamespace(output=output, task=SimpleNamespace(input=task)))

    assert reward("6194 - 1528 + 1312 - 1640", answer="4338") == 1.0  # right: the plain match
    assert reward("6194 + 1528 - 1312 + 1640") == 0.5  # every number, wrong operations
    three = reward("6194 + 1312 - 1640")  # F1 of 3 of 4 numbers, all of them the problem's
    assert three == pytest.approx(0.5 * 2 * 1.0 * 0.75 / 1.75)
    assert reward("6194 + 1312 - 1640 + 9999") < three  # a number not in the problem costs precision
    assert reward("1250 + 340 - 75") == 0.0  # the worked example's numbers
    assert reward("1312 + 1312 + 1312") == pytest.approx(0.5 * 2 * (1 / 3) * 0.25 / (1 / 3 + 0.25))  # a multiset
    for output in ({"answer": "ANSWER: 1"}, {"answer": "x", "tool_calls": [{"arguments": "not json"}]}, None, "7"):
        assert credit.agl_reward(SimpleNamespace(output=output, task=SimpleNamespace(input={"answer": 2}))) == 0.0
    for weight in (0.0, 1.0, -0.5, True):
        with pytest.raises(ValueError, match="operand-credit: .* must be above 0 and below 1"):
            calc.rewards.OperandCredit(weight)


def test_train_registers_the_reward_its_options_pick(capsys):
    import argparse

    from examples.calc_agent import spec, train

    name, plugin = spec.SPEC.reward(argparse.Namespace(operand_credit=0.25))
    assert name == "calc-operand-credit-0.25" and plugin.weight == 0.25
    assert spec.SPEC.reward(argparse.Namespace(operand_credit=0.0)) is None  # the rewards module
    with pytest.raises(SystemExit) as exit_:
        train.main(["--steps", "10", "--operand-credit", "1.5"])
    assert exit_.value.code == 2
    assert "operand-credit: 1.5 must be above 0 and below 1" in capsys.readouterr().err
