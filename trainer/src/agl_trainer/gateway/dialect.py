"""The interface every API the gateway speaks to its clients implements.

The gateway speaks three APIs, each in its own module, all served on the engine's
OpenAI-compatible interface: OpenAI's chat and text completions
(:mod:`agl_trainer.gateway.openai_api`), OpenAI's Responses API
(:mod:`agl_trainer.gateway.responses_api`) and Anthropic's Messages API
(:mod:`agl_trainer.gateway.messages_api`). A :class:`Dialect` turns a client's request into
the engine's, the engine's answer (whole or streamed) into the client's, and errors into the
shape the API's SDKs read. The route table (:mod:`agl_trainer.gateway.app`) names the
dialect of each route; the pipeline in between (policies, seeds, the pause gate, replicas,
recording) is the same for all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agl_trainer.gateway.errors import GatewayError
from agl_trainer.gateway.recorder import CallMeta, Recorder
from agl_trainer.gateway.upstream import UpstreamResponse


class Dialect(Protocol):
    """One API the gateway speaks to its clients."""

    endpoint: str
    """The call's endpoint as recorded (``chat.completions``, ``completions``, ``responses``, ``messages``)."""
    id_prefix: str
    """What the ids of the gateway's answers begin with (``chatcmpl-``, ``cmpl-``, ``resp_``, ``msg_``)."""
    engine_path: str
    """The engine route a call goes to (``/chat/completions`` or ``/completions``)."""

    def engine_request(self, req: dict) -> dict:
        """The client's request (JSON, checked by :func:`agl_trainer.gateway.validate.check_body`)
        checked and told in the engine's terms; a 400 naming the field when it cannot be."""

    def upstream(self, engine_req: dict, model: str | None, cap: int | None) -> dict:
        """The body sent to the engine: ``engine_req`` for ``model``, asking for token ids, at
        most ``cap`` response tokens (the rollout's cap, if any)."""

    def engine_error(self, err: GatewayError) -> GatewayError:
        """An engine's refusal (already the gateway's error) told in this API's terms."""

    def error_body(self, err: GatewayError) -> bytes:
        """An error answer's body, in the shape this API's clients read."""

    async def answer(
        self, recorder: Recorder, meta: CallMeta, req: dict, resp: UpstreamResponse, model: str | None, send: Callable
    ) -> None:
        """Answer the client from the engine's 200 answer ``resp`` (read whole already unless ``req``
        streams), showing ``model``, and record the call with ``recorder``."""


def openai_error_body(err: GatewayError) -> bytes:
    """``err`` in OpenAI's error shape (every route but the Anthropic ones)."""
    return err.encode()


class OpenAIErrors:
    """The error half of a :class:`Dialect` whose clients read OpenAI's error shape: an engine's
    refusal passes as it is, and an error's body is :func:`openai_error_body`'s."""

    @staticmethod
    def engine_error(err: GatewayError) -> GatewayError:
        """An engine's refusal, as it is: the engine speaks OpenAI's API too."""
        return err

    @staticmethod
    def error_body(err: GatewayError) -> bytes:
        """``err`` in OpenAI's error shape."""
        return openai_error_body(err)
