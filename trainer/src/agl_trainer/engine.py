"""The inference-engine seam.

An engine serves the policy under training behind one or more OpenAI-compatible
HTTP servers (replicas) that speak the *token-id dialect* vLLM introduced:

- ``POST /v1/chat/completions`` accepts ``"return_token_ids": true`` and
  ``"logprobs": true`` and answers with a top-level ``prompt_token_ids`` list,
  ``choices[i].token_ids`` and ``choices[i].logprobs.content[j].logprob``;
- ``POST /v1/completions`` accepts a prompt given as token ids, with the same
  extra fields in its answer (``choices[i].prompt_token_ids`` where per choice);
- ``GET /v1/models`` lists what it serves.

An engine may add ``choices[i].behaviour_logprobs`` beside ``token_ids``: each token's
log-prob under the distribution it was sampled from (after temperature, top-p and top-k),
where ``logprobs`` holds the raw model's. An engine that can only give one kind says which
through :attr:`Engine.logprobs_kind` (vLLM's ``--logprobs-mode processed_logprobs`` gives
the behaviour ones), and the gateway records them as such.

The gateway (:mod:`agl_trainer.gateway`) sits in front of the replicas, routes each
rollout to one of them and records the token ids. Engine plugins (the
``transformers`` and ``vllm`` engines in agl-verl) implement :class:`Engine` and
are registered through the ``agl_register_engines`` hook.
"""

from __future__ import annotations

import abc
from typing import Literal

from agl.schema import ModelVersion


class Engine(abc.ABC):
    """Starts, serves and updates the policy's weights."""

    @abc.abstractmethod
    def start(self) -> list[str]:
        """Start the replicas and return their base URLs (``http://127.0.0.1:PORT/v1``)."""

    @abc.abstractmethod
    def load_version(self, version: ModelVersion) -> None:
        """Serve the weights (or adapter) at ``version.path`` as ``version.version``.

        Requests in flight finish on the old weights; later ones see the new.

        ``version.policy`` names the policy the weights are for. None is the default policy,
        which answers every request that names no other. A named policy answers the requests
        whose ``model`` is :meth:`policy_model` of it, beside the others (an engine that serves
        one set of weights only refuses it with ``ValueError``); its ``version.path`` None
        means the base model's own weights, as for a policy that is never trained.
        """

    @property
    @abc.abstractmethod
    def model_version(self) -> str | None:
        """The version served now."""

    def stop(self) -> None:
        """Stop the replicas."""

    def policy_model(self, policy: str) -> str:
        """The ``model`` a request gives to be answered by ``policy`` (loaded with :meth:`load_version`)."""
        return policy

    logprobs_kind: Literal["raw", "behaviour"] = "raw"
    """What the engine's ``logprobs`` are: the raw model's (``behaviour_logprobs``, where given,
    are then the sampled ones), or the log-probs the tokens were sampled with."""

    def counters(self) -> dict[str, int]:
        """Running totals the engine keeps (token counts, cache hits), by name; none by default.

        The trainer logs each step's increase of every counter as ``engine/<name>``.
        """
        return {}

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
