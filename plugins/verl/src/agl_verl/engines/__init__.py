"""Inference engines for agl: ``transformers`` (in-process, CPU or one GPU) and ``vllm`` (a vLLM server).

Both serve OpenAI-compatible HTTP in vLLM's token-id dialect (see :mod:`agl_trainer.engine`).
Modules: ``transformers_engine`` (the Engine), ``server`` (HTTP app, standalone CLI),
``serving`` (one replica's request handling), ``batching`` (dynamic batching),
``prefix_cache`` (KV blocks of prompts computed before),
``protocol`` (request validation), ``tools`` (the tool-call convention), ``weights``
(loading new versions), ``vllm_engine``.
"""

DEFAULT_PREFIX_CACHE_MB = 1024
"""Each transformers replica's prefix cache by default: about 22k tokens of SmolLM2-135M in float32."""
