"""The model gateway: an OpenAI- and Anthropic-compatible front to the engines that records token ids.

Agents under training reach the model through the gateway (``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/models``, and Anthropic's ``/v1/messages``
and ``/v1/messages/count_tokens``, see :mod:`agl_trainer.gateway.messages_api`), routed
per rollout at ``/rollouts/{rollout_id}/v1``. The gateway asks the engine replicas for
token ids and logprobs (vLLM's dialect, see :mod:`agl_trainer.engine`) and records one
:class:`~agl.schema.LLMCall` per call, keyed by the response id it returns.

    from agl_trainer.gateway import Gateway
    gw = Gateway(store, upstreams=["http://127.0.0.1:8000/v1"], token="secret").start()
    gw.rollout_base_url(rollout_id)     # what the agent uses as OPENAI_BASE_URL
    gw.rollout_key(rollout_id, attempt) # ... and as OPENAI_API_KEY: its rollout's key, nothing more
    gw.rollout_anthropic_url(rollout_id) # ANTHROPIC_BASE_URL (ANTHROPIC_API_KEY: the same key)
    gw.model_version = "v3"; gw.pause(); gw.resume(); gw.stop()

Who may call what (rollout keys, the production token, the admin token) is in
:mod:`agl_trainer.gateway.auth`.
"""

from agl_trainer.gateway.continuity import Continuity, Mismatch, check_continuity
from agl_trainer.gateway.errors import GatewayError
from agl_trainer.gateway.server import Gateway

__all__ = ["Continuity", "Gateway", "GatewayError", "Mismatch", "check_continuity"]
