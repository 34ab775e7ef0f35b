"""Inference engines for agl: ``transformers`` (in-process, CPU or one GPU) and ``vllm`` (a vLLM server).

Both serve OpenAI-compatible HTTP in vLLM's token-id dialect (see :mod:`agl_trainer.engine`).
Modules: ``transformers_engine`` (the Engine), ``server`` (HTTP app, standalone CLI),
``serving`` (one replica's request handling), ``batching`` (dynamic batching),
``protocol`` (request validation), ``tools`` (the tool-call convention), ``weights``
(loading new versions), ``vllm_engine``.
"""
