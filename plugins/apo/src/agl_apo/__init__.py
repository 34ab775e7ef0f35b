"""agl-apo: prompt optimization for agl, the ``apo`` backend.

It changes an agent's resources (a system prompt, a list of few-shot examples) instead of
its weights, from the same rollouts a weight-training backend learns from, with or without
engine token ids: textual gradients in the spirit of APO (Pryzant et al., 2023) and
demonstrations bootstrapped from successful rollouts in the spirit of DSPy's BootstrapFewShot,
every candidate scored on a validation batch and a beam of the best kept. See README.md.
"""

__version__ = "0.1.0"
