"""Loading weights for the transformers engine: a model directory, a state dict, or a LoRA adapter."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or a torch dtype) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, not {dtype!r}")
    return DTYPES[dtype]


def load_model(path: str | os.PathLike, dtype: torch.dtype, device: str) -> Any:
    """A causal LM from a Hugging Face directory, in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    from agl_verl.quiet import no_progress_bars

    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


def is_adapter(path: Path) -> bool:
    """Whether ``path`` is a peft adapter directory."""
    return path.is_dir() and (path / "adapter_config.json").is_file()


def load_weights(
    path: str | os.PathLike, *, base_path: str | os.PathLike, current: Any, dtype: torch.dtype, device: str
) -> Any:
    """The model to serve for weights at ``path``.

    - a peft adapter directory: the base model (``base_path``) with the adapter merged in;
    - a Hugging Face model directory: loaded as is;
    - a file (``.safetensors``, or a ``torch.save``d state dict): loaded into a copy of
      ``current``; keys must match (a missing ``lm_head.weight`` is fine for tied embeddings).
    The architecture's vocabulary must match the one served now (the tokenizer stays).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"version.path: {p} does not exist")
    if is_adapter(p):
        from peft import PeftModel

        base = load_model(base_path, dtype, device)
        model = PeftModel.from_pretrained(base, p).merge_and_unload().eval()
    elif p.is_dir():
        model = load_model(p, dtype, device)
    else:
        model = copy.deepcopy(current)
        state = _read_state_dict(p)
        result = model.load_state_dict(state, strict=False)
        missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"version.path: state dict {p} does not fit the served model "
                f"(missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]})"
            )
        if model.config.tie_word_embeddings:
            model.tie_weights()
        model = model.to(device=device, dtype=dtype).eval()
    if model.config.vocab_size != current.config.vocab_size:
        raise ValueError(
            f"version.path: vocabulary size {model.config.vocab_size} differs from the served "
            f"model's {current.config.vocab_size}"
        )
    return model


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"version.path: {path} does not hold a state dict")
    return state
