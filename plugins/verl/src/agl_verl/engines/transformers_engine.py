"""The ``transformers`` engine: a Hugging Face causal LM behind OpenAI-compatible servers.

>>> engine = TransformersEngine("path/to/model")          # doctest: +SKIP
>>> urls = engine.start()                                   # ["http://127.0.0.1:PORT/v1"]
>>> engine.load_version(ModelVersion(version="step-3", path="ckpt/step-3"))

Every replica is an HTTP server (see :mod:`agl_verl.engines.server`) on one asyncio loop
in a background thread, with its own batching worker (:mod:`agl_verl.engines.batching`);
replicas share one copy of the weights. Answers follow vLLM's token-id dialect, with
logprobs taken from the raw logits; tools follow the convention in
:mod:`agl_verl.engines.tools` when the chat template has no tool section.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agl.schema import ModelVersion
from agl_trainer.engine import Engine
from agl_trainer.http import BackgroundServer
from agl_verl.engines import DEFAULT_PREFIX_CACHE_MB
from agl_verl.engines.adapters import AdapterSet
from agl_verl.engines.batching import Batcher, WeightSlot
from agl_verl.engines.server import create_app, serve_in_thread
from agl_verl.engines.serving import Replica
from agl_verl.engines.weights import is_adapter, load_model, load_weights, resolve_dtype

COUNTERS = ("prompt_tokens", "prompt_tokens_computed", "prompt_tokens_cached", "generated_tokens")


class TransformersEngine(Engine):
    """Serves a Hugging Face model directory with token ids and logprobs.

    ``model_path``: a model directory with its tokenizer. ``replicas`` servers listen on
    ``host`` (loopback by default) at ``port``, ``port+1``, ... (``port=0``: free ports).
    ``max_batch_size`` bounds the rows (requests × n) decoded together; 1 serves one row
    at a time. ``dtype`` is float32 (default, exact logprobs on CPU), bfloat16 or float16.
    ``max_model_len`` defaults to the model's ``max_position_embeddings``. ``api_key``, if
    given, is required as a bearer token. ``version`` names the initial weights.
    ``prefix_cache_mb`` bounds each replica's cache of prompt KV blocks (0: no cache, every
    prompt computed whole); see :mod:`agl_verl.engines.prefix_cache`.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str = "cpu",
        replicas: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 32,
        dtype: str = "float32",
        seed: int = 0,
        api_key: str | None = None,
        max_model_len: int | None = None,
        served_model_name: str | None = None,
        version: str = "base",
        batch_wait_ms: float = 2.0,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
    ) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_dir():
            raise ValueError(f"model_path: {self.model_path} is not a model directory")
        if replicas < 1:
            raise ValueError(f"replicas: must be at least 1, got {replicas}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be at least 1, got {max_batch_size}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb: must be 0 (no cache) or more, got {prefix_cache_mb}")
        self.device = device
        self.replicas = replicas
        self.host = host
        self.port = port
        self.max_batch_size = max_batch_size
        self.dtype = resolve_dtype(dtype)
        self.seed = seed
        self.api_key = api_key
        self.served_model_name = served_model_name or self.model_path.name
        self._max_model_len = max_model_len
        self._initial_version = version
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.prefix_cache_bytes = int(prefix_cache_mb * 2**20)
        self._slot: WeightSlot | None = None
        #: the default policy's weights as mixed mode takes them (see :meth:`_adapter_on_base`)
        self._default_adapter: Path | None | bool = None
        self._default_path: str | None = None
        self._batchers: list[Batcher] = []
        self._server: BackgroundServer | None = None
        self._load_lock = threading.Lock()
        self.tokenizer = None
        self.urls: list[str] = []

    def start(self) -> list[str]:
        """Load the model and start the replicas; returns their base URLs."""
        if self._server is not None:
            return self.urls
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = load_model(self.model_path, self.dtype, self.device)
        self._slot = WeightSlot(model, self._initial_version)
        max_len = self._max_model_len or int(getattr(model.config, "max_position_embeddings", 2048))
        eos = _eos_ids(model, self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        apps = []
        for k in range(self.replicas):
            batcher = Batcher(
                self._slot,
                self.tokenizer,
                eos_token_ids=eos,
                pad_token_id=pad,
                max_model_len=max_len,
                max_batch_size=self.max_batch_size,
                batch_wait_s=self.batch_wait_s,
                seed=self.seed + k,
                device=self.device,
                name=f"agl-engine-batcher-{k}",
                prefix_cache_bytes=self.prefix_cache_bytes,
            )
            self._batchers.append(batcher)
            replica = Replica(
                self._slot, self.tokenizer, batcher, model_name=self.served_model_name, max_model_len=max_len
            )
            apps.append(create_app(replica, api_key=self.api_key))
        self._server = serve_in_thread(apps, host=self.host, port=self.port)
        self.urls = [f"{url}/v1" for url in self._server.urls]
        return self.urls

    def load_version(self, version: ModelVersion) -> None:
        """Load ``version.path`` (model dir, state-dict file or LoRA adapter) and serve it.

        Loading happens on the caller's thread while the old weights keep serving; the
        batchers switch at their next batch, so requests in flight finish on the old
        weights. An adapter is merged into ``version.base_model`` (default: the engine's
        ``model_path``).

        A named policy (``version.policy``) switches the engine to mixed mode for good
        (:mod:`agl_verl.engines.adapters`): the base model with one peft adapter per policy,
        rows of different policies in the same batch. Its ``version.path`` is a LoRA adapter
        on the engine's ``model_path``, or None for the base weights. The default policy
        joins as an adapter too, so its weights must be the base or such an adapter: a full
        model or state dict is refused with ``ValueError``. In mixed mode a new version of a
        policy takes effect for rows admitted after it; rows running keep their adapter.
        """
        if self._slot is None:
            raise RuntimeError("start() the engine before load_version()")
        if not version.path and version.policy is None:
            raise ValueError("version.path: required to load a model version")
        with self._load_lock:
            current, _ = self._slot.get()
            if version.policy is None and not isinstance(current, AdapterSet):
                model = load_weights(
                    version.path,
                    base_path=version.base_model or self.model_path,
                    current=current,
                    dtype=self.dtype,
                    device=self.device,
                )
                self._slot.set(model, version.version)
                self._default_adapter = self._adapter_on_base(version)
                self._default_path = version.path
                return
            adapter = self._adapter_on_base(version, required=True)
            if not isinstance(current, AdapterSet):
                current = self._mixed_mode(version)
            default_version = self.model_version if version.policy is not None else version.version
            model_name = self.policy_model(version.policy) if version.policy is not None else None
            current.set_policy(version.policy, adapter, version.version, model_name)
            self._slot.set(current, default_version)

    def _adapter_on_base(self, version: ModelVersion, *, required: bool = False) -> Path | None | bool:
        """``version.path`` as a LoRA adapter on ``model_path``, None for the base weights, or False
        when it is neither (a full model, a state dict, an adapter on another base): ValueError if
        ``required``, naming the path and why."""
        if not version.path:
            return None
        path = Path(version.path)
        if not path.exists():
            raise FileNotFoundError(f"version.path: {path} does not exist")
        if not is_adapter(path):
            why = "a full model or state dict, not a LoRA adapter"
        elif version.base_model and Path(version.base_model).resolve() != self.model_path.resolve():
            why = f"an adapter on {version.base_model}, not on the engine's model {self.model_path}"
        else:
            return path
        if required:
            raise ValueError(
                f"version.path: {path} is {why}; several policies are served as LoRA adapters on one base model"
            )
        return False

    def _mixed_mode(self, version: ModelVersion) -> AdapterSet:
        """The base model with the default policy's current weights as its first adapter."""
        if self._default_adapter is False:
            raise ValueError(
                f"version.path: {version.path} cannot be served for policy {version.policy!r}: the default "
                f"policy serves a full model or state dict ({self._default_path}), not the base model or "
                f"a LoRA adapter on {self.model_path}, so it cannot share a batch with adapters"
            )
        adapters = AdapterSet(load_model(self.model_path, self.dtype, self.device))
        adapters.set_policy(None, self._default_adapter, self.model_version)
        return adapters

    @property
    def model_version(self) -> str | None:
        """The version served now (``version`` given at construction until a load)."""
        return self._slot.get()[1] if self._slot is not None else None

    @property
    def adapters(self) -> AdapterSet | None:
        """The policies' adapters in mixed mode; None until a named policy is loaded."""
        model = self._slot.get()[0] if self._slot is not None else None
        return model if isinstance(model, AdapterSet) else None

    @property
    def batchers(self) -> list[Batcher]:
        """The replicas' batching workers (counters for tests and benchmarks)."""
        return list(self._batchers)

    def counters(self) -> dict[str, int]:
        """Totals over the replicas since start: prompt tokens (``prompt_tokens``), of them computed
        (``prompt_tokens_computed``) and taken from the prefix cache or a row with the same prompt
        (``prompt_tokens_cached``), and ``generated_tokens``."""
        totals = dict.fromkeys(COUNTERS, 0)
        for batcher in self._batchers:
            for name in COUNTERS:
                totals[name] += getattr(batcher, name)
        return totals

    def stop(self) -> None:
        """Stop the servers and the batching workers."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        for batcher in self._batchers:
            batcher.close()
        self._batchers = []
        self.urls = []


def _eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list):
            ids.extend(v for v in value if isinstance(v, int))
    if not ids:
        raise ValueError("model_path: the model names no EOS token (generation_config or tokenizer)")
    return sorted(set(ids))
