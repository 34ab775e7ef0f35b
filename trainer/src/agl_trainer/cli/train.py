"""``agl train my_module:agent --config train.yaml``: train an agent.

Flags override the config file: ``--tasks``/``--val`` (JSONL), ``--plugin`` (added to
``plugins``), ``--logger`` (added to ``loggers``: tensorboard, wandb), ``--backend``,
``--model`` (the weights both the backend trains and, when no engine is configured,
a ``transformers`` engine serves), ``--workdir``, ``--steps``, ``--store`` and any
field as ``--set rollout.concurrency=8`` (the value is read as YAML: ``8``, ``true``, ``[a, b]``).
"""

from __future__ import annotations

from pathlib import Path

from agl_trainer.cli._common import add_store_argument, store_help


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train an agent with reinforcement learning")
    p.add_argument(
        "agent",
        nargs="?",
        default=None,
        help="the agent function, module:function or file.py:function (leave out with external runners)",
    )
    p.add_argument("--config", default=None, help="trainer config file (.yaml, .json or .toml)")
    p.add_argument("--tasks", default=None, help="training tasks, JSONL (one task a line)")
    p.add_argument("--val", default=None, help="held-out tasks, JSONL")
    p.add_argument("--backend", default=None, help="algorithm backend name (e.g. verl)")
    p.add_argument("--engine", default=None, help="inference engine name (e.g. transformers, vllm)")
    p.add_argument("--model", default=None, help="model weights (a local directory) to train and serve")
    p.add_argument("--workdir", default=None, help="where checkpoints, metrics and plots go")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    add_store_argument(p, help=store_help("where agl rollouts, agl runner and agl export look"))
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="SPEC",
        help="register a plugin first (a reward, say): module, file.py or module:attribute; repeatable",
    )
    p.add_argument(
        "--logger",
        action="append",
        default=[],
        metavar="NAME",
        help="log each step to an experiment tracker: tensorboard (<workdir>/tensorboard) or wandb "
        "(offline, <workdir>/wandb); repeatable; options go in the config's loggers list",
    )
    p.add_argument(
        "--from-store",
        action="store_true",
        help="train on rollouts already in the store (recorded traffic, `agl run`), each at most once, instead "
        "of generating them; the config's from_store section filters them (default: production, rewarded)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.set_defaults(func=run)


def build_config(args):
    """The config from the file and the flags; errors name the flag or field."""
    from agl.errors import ConfigError
    from agl_trainer.config import apply_overrides, load_config, parse_config

    overrides: dict = {}
    for flag, key in [("workdir", "workdir"), ("steps", "steps"), ("store", "store")]:
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    if args.backend is not None:
        overrides["backend.name"] = args.backend
    if args.engine is not None:
        overrides["engine.name"] = args.engine
    for item in args.set:
        if "=" not in item:
            raise ConfigError(f"--set: expected KEY=VALUE, got {item!r}")
    data = load_config(args.config, args.set).model_dump(mode="json") if args.config else apply_overrides({}, args.set)
    config = parse_config(apply_overrides(data, overrides), "flags")
    if args.plugin:
        config = config.model_copy(update={"plugins": [*config.plugins, *args.plugin]})
    if args.from_store and config.from_store is None:
        config = parse_config({**config.model_dump(mode="json"), "from_store": {}}, "--from-store")
    if args.logger:
        data = config.model_dump(mode="json")
        have = {entry["name"] for entry in data["loggers"]}
        data["loggers"] += [name for name in dict.fromkeys(args.logger) if name not in have]
        config = parse_config(data, "--logger")
    if args.model is not None:
        data = config.model_dump(mode="json")
        if data.get("backend") is None:
            raise ConfigError("--model: name a backend too (--backend verl, or backend: in the config)")
        data["backend"]["config"]["model_path"] = args.model
        own_servers = data["backend"]["config"].get("mode") == "distributed"  # verl's vLLM servers serve it
        if data.get("engine") is None and not data.get("engine_urls") and not own_servers:
            data["engine"] = {"name": "transformers", "config": {}}
        if data.get("engine") is not None:
            data["engine"]["config"].setdefault("model_path", args.model)
        config = parse_config(data, "flags")
    return config


def check_file(flag: str, path: str) -> None:
    """A ConfigError naming ``flag`` when ``path`` is not a readable file."""
    from agl.errors import ConfigError

    if not Path(path).is_file():
        problem = "is a directory, not a file" if Path(path).is_dir() else "no such file"
        raise ConfigError(f"{flag}: {path}: {problem} (a JSONL file, one task a line)")


def run(args) -> int:
    from agl.errors import ConfigError
    from agl.plugins import load_plugin
    from agl.runner import load_agent
    from agl_trainer.cli.run import hide_password
    from agl_trainer.trainer import Trainer, load_tasks_jsonl

    config = build_config(args)
    for spec in args.plugin or []:  # loaded here so that an error names the flag (the trainer finds them loaded)
        load_plugin(spec, f"--plugin {spec}")
    recorded = config.from_store is not None
    if config.rollout.runners == "inprocess" and args.agent is None and not recorded:
        raise ConfigError("agent: give module:function (or set rollout.runners=external and start `agl runner`s)")
    if args.tasks is None and not recorded:
        raise ConfigError("--tasks: a JSONL file of training tasks is required")
    if args.tasks is not None:
        check_file("--tasks", args.tasks)
    if args.val:
        check_file("--val", args.val)
    agent = load_agent(args.agent) if args.agent else None
    print(f"agl train: store {hide_password(config.store_url())}", flush=True)
    train = load_tasks_jsonl(args.tasks, "train") if args.tasks else []
    val = load_tasks_jsonl(args.val, "val") if args.val else []
    if own_loop(config):
        return run_own_loop(config, agent, train, val)
    Trainer(config).fit(agent, train, val)  # which says what it did, once
    return 0


def own_loop(config) -> bool:
    """Whether the backend runs the training loop itself: ``backend.config.mode: distributed``
    (agl-verl's, where verl's trainer drives the steps on Ray)."""
    return config.backend is not None and config.backend.config.get("mode") == "distributed"


def run_own_loop(config, agent, train, val) -> int:
    """Hand the run to the backend's ``train_distributed(config, agent, train, val)``."""
    from agl.errors import ConfigError
    from agl.plugins import load_plugin, resolve

    for i, spec in enumerate(config.plugins):
        load_plugin(spec, f"plugins[{i}]")
    backend = resolve("backend", config.backend.name, config.backend.config, field="backend")
    if not hasattr(backend, "train_distributed"):
        raise ConfigError(f"backend.config.mode: backend {config.backend.name!r} has no distributed mode")
    return backend.train_distributed(config, agent, train, val)
