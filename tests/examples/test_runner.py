"""The examples' shared runner: each spec finds its parts, and each command keeps its options."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agl_trainer.config import TrainerConfig
from examples.calc_agent.spec import SPEC as CALC
from examples.evaluation import evaluate_parser
from examples.loggers import with_loggers
from examples.rag_agent.spec import SPEC as RAG
from examples.sql_agent.spec import SPEC as SQL
from examples.training import parse_train_args

ROOT = Path(__file__).parents[2]
SPECS = pytest.mark.parametrize("spec", [CALC, RAG, SQL], ids=lambda spec: spec.name)


@SPECS
def test_a_spec_finds_its_parts_by_their_module_names(spec):
    package = importlib.import_module(spec.package)
    assert spec.package == f"examples.{spec.name}" and Path(package.__file__).parent == ROOT / "examples" / spec.name
    assert spec.agent is getattr(importlib.import_module(f"{spec.package}.agent"), spec.name)
    assert spec.runs == spec.name.replace("_", "-")
    assert set(spec.defaults) == {"steps", "batch_size", "n_rollouts", "max_response_tokens"}
    assert spec.part("rewards").agl_reward


@SPECS
def test_train_takes_the_common_options_and_picks_the_configs_training_tasks(spec, tmp_path):
    argv = ["--seed", "2", "--steps", "3", "--batch-size", "1", "--n-rollouts", "2", "--fresh"]
    argv += ["--results", str(tmp_path / "r"), "--workdir", str(tmp_path / "w"), "--model", str(tmp_path / "m")]
    argv += ["--max-response-tokens", "9", "--eval-limit", "1", "--before", "run", "--threads", "1"]
    args, train = parse_train_args(spec, argv, None)
    assert (args.seed, args.steps, args.batch_size, args.n_rollouts, args.fresh) == (2, 3, 1, 2, True)
    assert (args.results, args.workdir, args.model) == (tmp_path / "r", tmp_path / "w", tmp_path / "m")
    assert (args.max_response_tokens, args.eval_limit, args.before, args.threads) == (9, 1, "run", 1)
    subset = spec.subset
    assert train == subset.select(spec.load_split("train"), subset.default) and train
    defaults, _ = parse_train_args(spec, [], None)
    assert [defaults.steps, defaults.batch_size, defaults.n_rollouts, defaults.max_response_tokens] == list(
        spec.defaults[k] for k in ("steps", "batch_size", "n_rollouts", "max_response_tokens")
    )
    assert spec.arm(defaults) == ("main" if spec is SQL else spec.name)


def test_each_examples_own_options_name_its_arm():
    calc, _ = parse_train_args(CALC, ["--lr", "1e-3", "--steps-without-signal", "skip", "--operations", "2", "3"], None)
    assert CALC.arm(calc) == "calc_agent-lr0.001-skip-ops2-3" and calc.operations == [2, 3]
    rag, _ = parse_train_args(RAG, ["--hops", "1", "2", "--batch-size", "2"], None)
    assert RAG.arm(rag) == "rag_agent-hops1-2-batch2"
    sql, easy_and_hard = parse_train_args(SQL, ["--arm", "broadcast", "--tiers", "easy", "hard"], None)
    assert SQL.arm(sql) == "broadcast" and {t["input"]["tier"] for t in easy_and_hard} == {"easy", "hard"}


@SPECS
def test_evaluate_takes_its_options_and_refuses_samples_without_a_temperature(spec, tmp_path, capsys):
    parser = evaluate_parser(spec, None)
    argv = ["--checkpoint", "ckpt", "--split", "val", "--limit", "3", "--out", str(tmp_path / "o.json")]
    argv += ["--temperature", "0.5", "--samples", "4", "--workdir", "w", "--concurrency", "2", "--threads", "1"]
    args = parser.parse_args([*argv, f"--{spec.subset.option}", str(spec.subset.default[0])])
    assert (args.checkpoint, args.split, args.limit, args.out) == (Path("ckpt"), "val", 3, tmp_path / "o.json")
    assert (args.temperature, args.samples, args.concurrency) == (0.5, 4, 2)
    assert getattr(args, spec.subset.option) == [spec.subset.default[0]]
    assert parser.parse_args([]).max_response_tokens == spec.defaults["max_response_tokens"]
    evaluate = importlib.import_module(f"{spec.package}.evaluate")
    with pytest.raises(SystemExit):
        evaluate.main(["--samples", "2"])
    assert "--samples: more than one sample needs a --temperature above 0" in capsys.readouterr().err


def test_a_missing_database_is_the_sql_commands_usage_error(tmp_path, capsys, monkeypatch):
    from examples.sql_agent import evaluate, train
    from examples.sql_agent.database import DB_ENV

    monkeypatch.delenv(DB_ENV, raising=False)

    for main in (train.main, evaluate.main):
        with pytest.raises(SystemExit) as exit_:
            main(["--db", str(tmp_path / "missing.db")])
        assert exit_.value.code == 2 and "Chinook database not found" in capsys.readouterr().err
        assert DB_ENV not in os.environ  # a refused --db is not left for the agent to find


def test_the_commands_run_as_modules_from_the_repository_root():
    commands = {
        "examples.calc_agent.train": "--steps-without-signal",
        "examples.sql_agent.evaluate": "--db",
        "examples.rag_agent.report": "--page",
        "examples.first_digit.train": "--preset",
    }
    for module in ("examples.calc_agent.train", "examples.first_digit.train"):
        commands[module] += " --logger {tensorboard,wandb}"  # each its own --logger too
    for module, option in commands.items():
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for each in option.split(" "):
            assert each in done.stdout, (module, each)


@SPECS
def test_logger_switches_the_trainers_loggers_on(spec, tmp_path):
    args, _ = parse_train_args(spec, ["--logger", "tensorboard", "--logger", "wandb", "--logger", "tensorboard"], None)
    config = spec.trainer_config(
        args,
        seed=0,
        workdir=tmp_path,
        model_path=tmp_path / "m",
        steps=1,
        batch_size=1,
        n_rollouts=2,
        max_response_tokens=8,
    )
    logged = with_loggers(config, args)
    assert logged["loggers"] == [*config.get("loggers", []), "tensorboard", "wandb"]
    assert [entry.name for entry in TrainerConfig.model_validate(logged).loggers] == ["tensorboard", "wandb"]
    none, _ = parse_train_args(spec, [], None)
    assert none.logger == [] and with_loggers(config, none) is config
    with pytest.raises(SystemExit):
        parse_train_args(spec, ["--logger", "mlflow"], None)


def test_logger_adds_only_loggers_the_config_does_not_have():
    config = {"loggers": [{"name": "wandb", "project": "p"}]}
    args = argparse.Namespace(logger=["wandb", "tensorboard"])
    assert with_loggers(config, args)["loggers"] == [{"name": "wandb", "project": "p"}, "tensorboard"]


def test_backend_settings_go_over_the_examples_and_name_the_arm(tmp_path):
    from examples.training import apply_backend_settings, arm_name

    argv = ["--backend-setting", "loss_agg_mode=seq-mean-token-mean", "--backend-setting", "kl_coef=0.01"]
    args, _ = parse_train_args(CALC, [*argv, "--workdir", str(tmp_path)], None)
    assert args.backend_setting == [("loss_agg_mode", "seq-mean-token-mean"), ("kl_coef", 0.01)]  # JSON, else text
    assert arm_name(CALC, args) == "calc_agent-kl_coef=0.01-loss_agg_mode=seq-mean-token-mean"
    config = CALC.trainer_config(
        args, seed=0, workdir=tmp_path, model_path="m", steps=1, batch_size=1, n_rollouts=2, max_response_tokens=8
    )
    lr = config["backend"]["config"]["lr"]
    apply_backend_settings(config, args.backend_setting)
    backend = config["backend"]["config"]
    assert (backend["kl_coef"], backend["loss_agg_mode"], backend["lr"]) == (0.01, "seq-mean-token-mean", lr)


def test_a_learning_rate_schedule_is_a_backend_setting(tmp_path):
    from examples.training import apply_backend_settings, arm_name

    argv = ["--backend-setting", "lr_scheduler_type=cosine", "--backend-setting", "lr_warmup_steps=5"]
    args, _ = parse_train_args(CALC, [*argv, "--workdir", str(tmp_path)], None)
    assert args.backend_setting == [("lr_scheduler_type", "cosine"), ("lr_warmup_steps", 5)]
    assert arm_name(CALC, args) == "calc_agent-lr_scheduler_type=cosine-lr_warmup_steps=5"
    config = CALC.trainer_config(
        args, seed=0, workdir=tmp_path, model_path="m", steps=1, batch_size=1, n_rollouts=2, max_response_tokens=8
    )
    apply_backend_settings(config, args.backend_setting)
    backend = config["backend"]["config"]
    assert (backend["lr_scheduler_type"], backend["lr_warmup_steps"]) == ("cosine", 5)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("kl_coef=-1", "--backend-setting: kl_coef: Input should be greater than or equal to 0"),
        ("loss_agg_mode=bogus", "--backend-setting: loss_agg_mode:"),
        ("klcoef=0.1", "--backend-setting: klcoef: Extra inputs are not permitted"),
        ("lr_scheduler_type=linear", "--backend-setting: lr_scheduler_type: Input should be 'constant' or 'cosine'"),
        ("min_lr_ratio=0.1", "--backend-setting: min_lr_ratio shapes the cosine schedule only"),
    ],
)
def test_a_backend_setting_the_backend_would_refuse_is_refused_before_the_run(setting, message, tmp_path):
    from examples.training import apply_backend_settings

    args, _ = parse_train_args(CALC, ["--backend-setting", setting, "--workdir", str(tmp_path)], None)
    config = CALC.trainer_config(
        args, seed=0, workdir=tmp_path, model_path="m", steps=1, batch_size=1, n_rollouts=2, max_response_tokens=8
    )
    with pytest.raises(SystemExit, match=message):
        apply_backend_settings(config, args.backend_setting)


@pytest.mark.parametrize("setting", ["seed=3", "temperature=1.0", "no-equals-sign"])
def test_a_backend_setting_the_runner_owns_or_without_a_value_is_a_usage_error(setting, capsys):
    with pytest.raises(SystemExit) as refused:
        parse_train_args(CALC, ["--backend-setting", setting], None)
    assert refused.value.code == 2
    assert "--backend-setting" in capsys.readouterr().err


def per_role_workdir(root: Path, published: list[str]) -> Path:
    """A training run's work directory as a run with a policy per role leaves it (the trainer's state
    names the policies; the writer's adapters are published under verl/versions)."""
    policies = [
        {"name": "writer", "models": ["sql-writer"], "train": True},
        {"name": "checker", "models": ["sql-checker"], "train": False},
    ]
    root.mkdir()
    (root / "trainer_state.json").write_text(json.dumps({"config": {"policies": policies}, "run_id": "run-x"}))
    for name in published:
        (root / "verl" / "versions" / name).mkdir(parents=True)
    return root


def test_a_per_role_run_is_evaluated_with_each_trained_policys_last_adapter(tmp_path):
    from examples.evaluation import policy_adapters, run_policies

    workdir = per_role_workdir(tmp_path / "run", ["writer-step-9", "writer-step-30", "writer-step-10"])
    policies = run_policies(workdir)
    assert [p["name"] for p in policies] == ["writer", "checker"]
    assert policy_adapters(workdir, policies) == {"writer": workdir / "verl" / "versions" / "writer-step-30"}
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "trainer_state.json").write_text(json.dumps({"config": {"policies": []}}))
    assert run_policies(tmp_path / "one") is None and run_policies(tmp_path / "adapter-dir") is None


def test_evaluate_names_a_per_role_run_whose_policy_published_nothing(tmp_path, capsys):
    from examples.sql_agent import evaluate

    workdir = per_role_workdir(tmp_path / "run", ["step-3"])
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(workdir), "--limit", "1"])
    err = capsys.readouterr().err
    assert f"checkpoint: {workdir} is neither" in err and "verl/versions/writer-step-N" in err
