"""The retrieval agent's data, retrieval, reward plugin, validity figures and tool errors (no model)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.examples.modules import example_modules
from tests.examples.train_yaml import assert_yaml_is_the_config

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def rag():
    return example_modules(
        "rag_agent", "agent", "collection", "config", "evaluation", "questions", "retrieval", "rewards"
    )


def committed(name: str) -> list[dict]:
    with (EXAMPLES / "rag_agent" / "data" / f"{name}.jsonl").open() as f:
        return [json.loads(line) for line in f]


# -- data ---------------------------------------------------------------------------------


def test_the_collection_and_questions_are_reproducible_and_committed(rag):
    docs = rag.collection.passages(rag.collection.build_world())
    assert len(docs) >= 500
    assert docs == committed("passages")
    assert len({d["doc_id"] for d in docs}) == len(docs)
    generated = rag.questions.generate()
    assert generated == rag.questions.generate()
    for split, tasks in generated.items():
        assert tasks == committed(split), split
    one_hop = committed(rag.questions.TRAIN_ONE_HOP)
    assert one_hop == rag.questions.of_hops(generated["train"], (1,)) == rag.questions.load_split("train-1hop")
    assert len(one_hop) == 96 and {t["input"]["hops"] for t in one_hop} == {1}
    # another seed gives another world: the figures above are not constants
    assert rag.collection.passages(rag.collection.build_world(seed=99)) != docs


def test_splits_are_disjoint_and_mostly_two_hop(rag):
    splits = rag.questions.generate()
    entities = {split: {t["input"]["entity"] for t in tasks} for split, tasks in splits.items()}
    assert not entities["train"] & entities["val"]
    assert not entities["train"] & entities["test"]
    assert not entities["val"] & entities["test"]
    questions = {split: {t["input"]["question"] for t in tasks} for split, tasks in splits.items()}
    assert not questions["train"] & (questions["val"] | questions["test"])
    for split, tasks in splits.items():
        two_hop = sum(t["input"]["hops"] == 2 for t in tasks) / len(tasks)
        assert two_hop >= 0.5, (split, two_hop)
    # val and test are asked in wording that training never uses
    for template in rag.questions.TEMPLATES:
        train_phrasings = {p.split("{")[0] for p in template.phrasings[:2]}
        for task in splits["test"]:
            if task["input"]["template"] == template.name:
                prefix = template.phrasings[2].split("{")[0]
                assert task["input"]["question"].startswith(prefix)
                assert prefix not in train_phrasings or not prefix


def test_every_gold_answer_is_stated_in_its_gold_passages(rag):
    docs = {d["doc_id"]: d["text"] for d in committed("passages")}
    for split in rag.questions.SPLITS:
        for task in committed(split):
            t = task["input"]
            assert len(t["gold_docs"]) == t["hops"]
            assert t["answer"] in docs[t["gold_docs"][-1]], task
            if t["hops"] == 2:  # the bridge: the first passage names the second passage's subject
                bridge = next(d for d in committed("passages") if d["doc_id"] == t["gold_docs"][1])["title"]
                assert bridge in docs[t["gold_docs"][0]] and t["answer"] not in docs[t["gold_docs"][0]], task


# -- retrieval ----------------------------------------------------------------------------


def test_search_finds_the_gold_passages_hop_by_hop(rag):
    index = rag.retrieval.default_index()
    titles = {d["doc_id"]: d["title"] for d in index.docs}
    sample = committed("test") + committed("val")[:10]
    for task in sample:
        t = task["input"]
        first = [d["doc_id"] for d in index.search(t["question"])]
        assert t["gold_docs"][0] in first, task
        if t["hops"] == 2:  # searching the name the first passage gives finds the second
            bridge = titles[t["gold_docs"][1]]
            query = bridge + " city" if t["template"] == "company_country" else bridge
            second = [d["doc_id"] for d in index.search(query)]
            assert t["gold_docs"][1] in second, task
    assert len(index.search("Kora Labs founder", k=2)) <= 2


def test_search_with_no_known_word_finds_nothing(rag):
    index = rag.retrieval.default_index()
    assert index.search("zzqx wvvk") == []
    assert index.search("the of and") == []
    assert rag.retrieval.format_hits([]) == "No results."


# -- reward -------------------------------------------------------------------------------


def rollout(output, answer="Taldor"):
    return SimpleNamespace(output=output, task=SimpleNamespace(input={"answer": answer}))


@pytest.mark.parametrize(
    ("answer", "gold", "f1", "em"),
    [
        ("Taldor", "Taldor", 1.0, 1.0),
        ("taldor.", "Taldor", 1.0, 1.0),
        ("The Taldor", "Taldor", 1.0, 1.0),
        ("Taldor city", "Taldor", 2 / 3, 0.0),
        ("Ada", "Ada Labraimuth", 2 / 3, 0.0),
        ("Ada Labraimuth", "Ada Labraimuth", 1.0, 1.0),
        ("Labraimuth Ada", "Ada Labraimuth", 1.0, 0.0),
        ("Vistund", "Taldor", 0.0, 0.0),
        ("", "Taldor", 0.0, 0.0),
        ("the", "Taldor", 0.0, 0.0),
        ("!!!", "", 0.0, 0.0),
    ],
)
def test_f1_and_exact_match(rag, answer, gold, f1, em):
    assert rag.rewards.token_f1(answer, gold) == pytest.approx(f1)
    assert rag.rewards.exact_match(answer, gold) == em


@pytest.mark.parametrize(
    "output",
    [None, 42, [], {}, {"answer": None}, {"answer": 7}, {"answer": ""}, {"stopped": "truncated", "answer": ""}],
)
def test_missing_or_malformed_answers_score_zero(rag, output):
    assert rag.rewards.agl_reward(rollout(output)) == 0.0


def test_the_plugin_scores_the_output_and_never_raises(rag):
    assert rag.rewards.agl_reward(rollout({"answer": "Taldor"})) == 1.0
    assert rag.rewards.agl_reward(rollout("It is Taldor")) == 0.5  # precision 1/3, recall 1
    assert rag.rewards.agl_reward(SimpleNamespace(output={"answer": "x"}, task=None)) == 0.0
    assert rag.rewards.agl_reward(SimpleNamespace(output={"answer": "x"}, task=SimpleNamespace(input="x"))) == 0.0
    assert rag.rewards.agl_reward(object()) == 0.0


def test_the_plugin_registers_as_a_user_registers_one(rag):
    import agl
    from agl.plugins import get_plugin_manager, reward_answers

    manager = get_plugin_manager()
    registered_before = manager.get_plugin("rag-test-token-f1") is not None
    agl.register_plugin(rag.rewards, name="rag-test-token-f1")
    try:
        assert not registered_before and manager.get_plugin("rag-test-token-f1") is rag.rewards
        answers = reward_answers(rollout=rollout({"answer": "taldor"}), spans=[], llm_calls=[], rewards=[])
        assert [(a.plugin, a.value, a.error) for a in answers if a.plugin == "rag-test-token-f1"] == [
            ("rag-test-token-f1", 1.0, None)
        ]
    finally:
        agl.plugins.unregister(rag.rewards)


# -- tool-call validity and malformed calls ----------------------------------------------


def call(*items):
    from agl.schema import LLMCall

    return LLMCall(call_id="c", response={"output": list(items)}, prompt_ids=[1], response_ids=[2])


def fc(name, arguments):
    return {"type": "function_call", "name": name, "arguments": arguments, "call_id": "x"}


def msg(text):
    return {"type": "message", "content": [{"type": "output_text", "text": text}]}


def test_each_llm_call_is_judged_valid_invalid_or_an_answer(rag):
    schemas = rag.evaluation._tool_schemas()
    verdict = rag.evaluation.call_verdict
    assert set(schemas) == {"search"}
    assert verdict(call(fc("search", '{"query": "Kora Labs"}')), schemas) == "valid"
    assert verdict(call(fc("search", '{"query": 5}')), schemas) == "invalid"
    assert verdict(call(fc("search", '{"query": "  "}')), schemas) == "invalid"
    assert verdict(call(fc("search", '{"query": "a", "title": "b"}')), schemas) == "invalid"  # strict schema
    assert verdict(call(fc("search", "{}")), schemas) == "invalid"
    assert verdict(call(fc("search", "not json")), schemas) == "invalid"
    assert verdict(call(fc("open_document", '{"query": "a"}')), schemas) == "invalid"
    assert verdict(call(msg('<tool_call>\n{"name": "search", "argu')), schemas) == "invalid"
    assert verdict(call(msg("Soran")), schemas) == "answer"
    assert verdict(call(), schemas) == "answer"


def test_malformed_calls_never_reach_the_sdk_as_calls(rag):
    """What the engine does with bad output (bad JSON, an unknown tool): text, which ends the episode."""
    from agl_verl.engines.tools import parse_tool_calls

    allowed = {tool.name for tool in rag.agent.TOOLS}
    for text in [
        '<tool_call>\n{"name": "search", "arguments": {"query": </tool_call>',
        '<tool_call>\n{"name": "lookup", "arguments": {"query": "x"}}\n</tool_call>',
        "<tool_call>\nsearch(Kora Labs)\n</tool_call>",
    ]:
        content, calls = parse_tool_calls(text, allowed=allowed)
        assert calls == [] and content == text
    _, calls = parse_tool_calls('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n', allowed=allowed)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"query": "x"}]


def test_wrong_argument_types_reach_the_agent_as_the_sdks_tool_error(rag):
    """A call to ``search`` with arguments of the wrong type is the SDK's normal tool error, given to the model."""
    from agents.run_context import RunContextWrapper
    from agents.tool_context import ToolContext

    tool = rag.agent.search

    async def invoke(arguments: str) -> str:
        ctx = ToolContext(
            context=RunContextWrapper(None).context, tool_name="search", tool_call_id="c1", tool_arguments=arguments
        )
        return await tool.on_invoke_tool(ctx, arguments)

    for bad in ['{"query": ["Kora"]}', '{"q": "Kora"}', "not json"]:
        result = asyncio.run(invoke(bad))
        assert isinstance(result, str) and result.startswith("An error occurred while running the tool"), (bad, result)
    good = asyncio.run(invoke('{"query": "Kora Labs"}'))
    assert "makes" in good or good == "No results."


# -- sampled evaluation ---------------------------------------------------------------------


def test_a_sampled_summary_counts_the_questions_a_grpo_group_would_learn_from(rag):
    from agl.schema import Rollout, RolloutStatus

    gold = {"rag-val-000": "Vistund", "rag-val-001": "Karl Kreitrousk", "rag-val-002": "tea"}
    tasks = {f"{qid}#sample{k}": {"answer": a, "hops": 1} for qid, a in gold.items() for k in range(2)}
    answers = {
        "rag-val-000#sample0": "Vistund",  # a hit and a miss: signal
        "rag-val-001#sample0": "Karl",  # two equal partial hits: a hit, no signal
        "rag-val-001#sample1": "Karl",
    }
    rollouts = [
        Rollout(task_id=tid, status=RolloutStatus.SUCCEEDED, output={"answer": answers.get(tid, "Zimar")})
        for tid in tasks
    ]

    summary = rag.evaluation.summarize(rollouts, tasks)

    assert summary["n"] == 6
    assert summary["f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 6)
    assert summary["questions_with_a_hit"] == pytest.approx(2 / 3)
    assert summary["questions_with_signal"] == pytest.approx(1 / 3)
    assert "questions_with_signal" not in rag.evaluation.summarize(rollouts[::2], tasks)  # one run per question


def test_train_yaml_is_the_run_train_py_makes(rag):
    made = rag.config.trainer_config(seed=0, workdir=Path("runs/rag-agent/yaml-seed0"), model_path="MODEL")
    assert_yaml_is_the_config(EXAMPLES / "rag_agent" / "train.yaml", made, "examples.rag_agent.rewards")


def test_the_report_is_built_from_the_results_files(rag, tmp_path):
    from examples.rag_agent import report
    from examples.reporting import END, START, markers

    def figures(f1, validity, cut):
        return {
            "f1": f1,
            "exact_match": f1 / 2,
            "f1_by_hops": {"1": 2 * f1, "2": 0.0},
            "tool_call_validity": validity,
            "tool_calls_per_episode": 1.0,
            "endings": {"answered": 20 - cut, "truncated": cut} if cut else {"answered": 20},
        }

    def record(seed, after, name="rag_agent", hops=(1,), batch_size=1):
        return {
            "name": name,
            "seed": seed,
            "steps": 10,
            "batch_size": batch_size,
            "n_rollouts": 8,
            "train_hops": list(hops),
            "temperature": 0.5,
            "lr": 3e-4,
            "eval_questions": 20,
            "wall_s": 1500.0 + 60 * seed,
            "before": figures(0.02, 0.25, 4),
            "after": figures(after, 0.5, 0),
            "train_f1_by_step": [0.0, 0.1, 0.2, 0.4],
        }

    results = tmp_path / "results"
    (results / "val-samples").mkdir(parents=True)
    (results / "val-samples" / "T0.5.json").write_text("{}")  # the validation probes are not runs
    for seed, after in ((1, 0.3), (0, 0.1)):
        (results / f"rag_agent-seed{seed}.json").write_text(json.dumps(record(seed, after)))
    old_arm = record(0, 0.05, name="rag_agent-hops1-2-batch2", hops=(1, 2), batch_size=2)
    (results / "rag_agent-hops1-2-batch2-seed0.json").write_text(json.dumps(old_arm))
    for seed, merged in ((0, 4), (1, 2)):  # 2 steps; each seed trained 16 calls
        merge_arm = record(seed, 0.2, name="rag_agent-merge") | {"transitions_config": {"merge": "prefix"}}
        rows_by_step = [8 - merged, 8]
        merge_arm["merge"] = {
            "total": {"merged_calls": merged, "rows": sum(rows_by_step), "learner_tokens": 1000.0 - 100 * merged}
            | {"unmerged_tokens": 1000.0, "update_s": 30.0 + seed},
            "breaks": {"not_extending": 2 + seed},
            "by_step": {"rows": rows_by_step},
        }
        (results / f"rag_agent-merge-seed{seed}.json").write_text(json.dumps(merge_arm))
    page = tmp_path / "results-page.md"
    merge_start, merge_end = markers("merge")
    page.write_text(f"intro\n{START}\nold\n{END}\nmiddle\n{merge_start}\nold\n{merge_end}\noutro\n")

    assert report.main(["--results", str(results), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert "before and after 10 steps at temperature 0.5, lr 0.0003" in text
    results_block, merge_block = text.split("middle")
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in results_block.splitlines() if line.startswith("| ")
    ]
    seed0, seed1, mean, other_arm, *merge_arm_rows = rows[
        1:
    ]  # the config's arm first, then the others; one seed: no mean row
    assert seed0[:7] == ["one-hop, 1 question x 8", "0", "0.020", "0.100", "0.040", "0.200", "0.000"]
    assert seed1[:2] == ["one-hop, 1 question x 8", "1"]
    assert mean[1] == "**mean ± std**" and mean[3] == "0.200 ± 0.141" and mean[5] == "0.400 ± 0.283"
    assert mean[8] == "10.0 ± 7.1"  # exact match after, in %
    assert mean[13:] == ["4.0 ± 0.0", "0.0 ± 0.0", "0.050 ± 0.000", "0.300 ± 0.000", "25.5 ± 0.7"]
    assert other_arm[:4] == ["all hops, 2 questions x 8", "0", "0.020", "0.050"]
    assert [r[0] for r in merge_arm_rows] == ["one-hop, 1 question x 8, calls merged"] * 3
    merge_rows = [[c.strip() for c in line.strip("|").split("|")] for line in merge_block.splitlines() if "| " in line]
    # calls (rows + merged), merged, rows, tokens per call -> merged, ratio, update s a step, breaks
    assert merge_rows[1] == ["rag_agent-merge", "0", "16", "4", "12", "1000", "600", "0.60", "15.0", "not_extending 2"]
    assert merge_rows[2][1:3] == ["1", "16"] and merge_rows[2][-1] == "not_extending 3"
    assert merge_rows[3][1] == "**mean ± std**" and merge_rows[3][3] == "3 ± 1" and merge_rows[3][7] == "0.70 ± 0.14"
    assert merge_rows[3][-1] == "not_extending 5"
    (tmp_path / "unmarked.md").write_text("no markers\n")
    assert report.main(["--results", str(results), "--page", str(tmp_path / "unmarked.md")]) == 1


def test_questions_are_chosen_by_hops_and_unknown_hops_are_refused(rag):
    val = rag.questions.load_split("val")

    one_hop = rag.questions.of_hops(val, (1,))

    assert len(one_hop) == 8 and {t["input"]["hops"] for t in one_hop} == {1}
    assert rag.questions.of_hops(val, (1, 2)) == val
    with pytest.raises(ValueError, match=r"hops: \[3\] not among 1 and 2"):
        rag.questions.of_hops(val, (3,))


def test_train_py_names_its_arm_and_refuses_unknown_hops_before_it_loads_anything(rag, tmp_path, capsys):
    from examples.rag_agent import spec, train

    assert spec.arm((1,), 1) == "rag_agent"  # the config's
    assert spec.arm((2, 1), 2) == "rag_agent-hops1-2-batch2"
    assert spec.arm((2,), 1) == "rag_agent-hops2"
    assert spec.arm((1,), 1, 15) == "rag_agent-steps15"
    with pytest.raises(SystemExit) as exit_:
        train.main(["--hops", "3", "--fresh", "--workdir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and "--hops: [3] not among 1 and 2" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
