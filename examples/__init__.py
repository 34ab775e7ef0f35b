"""Runnable agents trained with agl, and the runner they share.

Run them from the repository root as modules, e.g. ``python -m examples.calc_agent.train --seed 0``.
Each tool-using example (``calc_agent``, ``rag_agent``, ``sql_agent``) describes itself in
its ``spec.py`` (:class:`examples.spec.ExampleSpec`); :mod:`examples.training`,
:mod:`examples.evaluation` and :mod:`examples.reporting` run seeds, evaluations and reports
for all of them. ``first_digit`` is the small job ``make train`` runs.
"""

import os

# The examples run on the bundled model files only: no download, and no hub lookups that
# would wait on a network that is not there. Set before anything imports huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# torch's OpenMP threads sleep while they wait instead of spinning (agl_verl.threads): libgomp reads
# the policy when torch loads, so agl_verl is imported here, before anything of an example imports torch.
import agl_verl  # noqa: E402, F401
