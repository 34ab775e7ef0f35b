"""One replica's request handling: render, generate through the batcher, answer in vLLM's dialect.

Answers carry what vLLM returns with ``"return_token_ids": true``: a top-level
``prompt_token_ids`` (chat) or per-choice ``prompt_token_ids`` (completions), and
``choices[i].token_ids``. Response ids include a final EOS or stop token when the model
produced one; the text leaves special tokens and stop strings out, so
``tokenizer.decode(token_ids, skip_special_tokens=True)`` starts with (and, without a stop
string, equals) the returned text. Logprobs are raw-logit log-softmax values (see
:mod:`agl_verl.engines.batching`); beside ``token_ids``, ``choices[i].behaviour_logprobs``
holds each token's log-prob under the distribution it was sampled from. A choice that a
stop string ended names that string in ``stop_reason``, as vLLM does (else it is null). A
streamed chat sends text and tool calls as they are generated
(:mod:`agl_verl.engines.chat_stream`). Each answer also names the ``model_version`` that
produced it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agl_trainer.http.sse import DONE_EVENT, data_event
from agl_verl.engines.adapters import AdapterSet
from agl_verl.engines.batching import Batcher, SamplingParams, Sequence, WeightSlot
from agl_verl.engines.chat_stream import ChatDeltas
from agl_verl.engines.protocol import ChatRequest, CompletionRequest, RequestError, Sampling
from agl_verl.engines.tools import ToolChoice, forced_prefix, parse_tool_calls, render_messages, template_supports_tools

TOOL_RETRIES = 2


@dataclass
class _Prepared:
    prompt_ids: list[int]
    forced_ids: list[int]
    tools_active: bool
    allowed: set[str]
    must_call: bool


class Replica:
    """Serves chat and completion requests for one model through one :class:`Batcher`."""

    def __init__(
        self, slot: WeightSlot, tokenizer: Any, batcher: Batcher, *, model_name: str, max_model_len: int
    ) -> None:
        self.slot = slot
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.vocab_size = len(tokenizer)
        self.native_tools = template_supports_tools(tokenizer)
        self._token_text: dict[int, str] = {}

    # -- rendering ------------------------------------------------------------------------

    def render_chat(self, req: ChatRequest) -> _Prepared:
        """The prompt ids the model sees for ``req`` (and the forced response prefix)."""
        tools_active = bool(req.tools) and req.tool_choice.mode != "none"
        kwargs: dict[str, Any] = {}
        if self.native_tools:
            messages = req.messages
            if tools_active:
                kwargs["tools"] = req.tools
        else:
            messages = render_messages(req.messages, req.tools, req.tool_choice)
        if req.continue_final_message:
            kwargs["continue_final_message"] = True
        try:
            ids = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
        except Exception as exc:  # noqa: BLE001 - template errors are the request's fault
            raise RequestError("messages", f"the chat template could not render these messages: {exc}") from exc
        choice = req.tool_choice
        if choice.mode == "required" and req.tools and len(req.tools) == 1:
            # one tool: "required" can only mean that one, so its name is forced as well
            choice = ToolChoice("function", req.tools[0]["function"]["name"])
        named = next((t for t in req.tools or [] if t["function"]["name"] == choice.name), None)
        prefix = forced_prefix(choice, named) if tools_active else ""
        forced = self.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
        return _Prepared(
            prompt_ids=list(ids),
            forced_ids=forced,
            tools_active=tools_active,
            allowed={t["function"]["name"] for t in req.tools or []},
            must_call=req.tool_choice.mode in ("required", "function"),
        )

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return list(prompt)
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def _params(self, s: Sampling, prompt_len: int, top_logprobs: int, param: str) -> SamplingParams:
        if prompt_len >= self.max_model_len:
            raise RequestError(
                param,
                f"This model's maximum context length is {self.max_model_len} tokens, "
                f"but the prompt has {prompt_len} tokens.",
            )
        max_tokens = s.max_tokens if s.max_tokens is not None else self.max_model_len - prompt_len
        if prompt_len + max_tokens > self.max_model_len:
            raise RequestError(
                "max_tokens",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion).",
            )
        return SamplingParams(max_tokens=max_tokens, top_logprobs=top_logprobs, **s.decoding())

    def _rows(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int,
        forced: list[int],
        attempt: int = 0,
        *,
        model: str | None = None,
    ) -> list[Sequence]:
        rows = []
        for i in range(n):
            p = SamplingParams(**{**params.__dict__})
            if p.seed is not None:
                p.seed = p.seed + i + 1000 * attempt
            rows.append(Sequence(prompt_ids=prompt_ids, params=p, forced_ids=forced, model_name=model))
        return rows

    def version_for(self, model_name: str | None) -> str | None:
        """The version that answers a request for ``model_name`` now (its policy's in mixed mode)."""
        model, version = self.slot.get()
        return model.route(model_name)[1] if isinstance(model, AdapterSet) else version

    def models(self) -> list[tuple[str, str | None]]:
        """``(model name, version)`` of what this replica answers: the default policy first, then
        each named policy in mixed mode."""
        model, version = self.slot.get()
        named = model.served() if isinstance(model, AdapterSet) else []
        return [(self.model_name, version), *named]

    def text_of(self, row: Sequence) -> str:
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        return text[: row.stop_at] if row.stop_at is not None else text

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    # -- chat -----------------------------------------------------------------------------

    async def chat(self, req: ChatRequest) -> dict:
        prepared = self.render_chat(req)
        params = self._params(req.sampling, len(prepared.prompt_ids), req.top_logprobs, "messages")
        rows = await self._generate(
            self._rows(prepared.prompt_ids, params, req.sampling.n, prepared.forced_ids, model=req.model)
        )
        if prepared.must_call:
            for attempt in range(1, TOOL_RETRIES + 1):
                failed = [i for i, r in enumerate(rows) if not self._message(req, prepared, r)[1]]
                if not failed:
                    break
                retry = await self._generate(
                    self._rows(prepared.prompt_ids, params, len(failed), prepared.forced_ids, attempt, model=req.model)
                )
                for i, row in zip(failed, retry, strict=False):
                    rows[i] = row
        choices = []
        for i, row in enumerate(rows):
            message, calls = self._message(req, prepared, row)
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": {"content": self._chat_logprobs(row)} if req.logprobs else None,
                "finish_reason": "tool_calls" if calls else row.finish_reason,
                "stop_reason": row.stop_str,
            }
            if req.sampling.return_token_ids:
                choice["token_ids"] = row.token_ids
                choice["behaviour_logprobs"] = row.behaviour_logprobs
            choices.append(choice)
        out = self._envelope("chatcmpl", "chat.completion", req.model, rows)
        out["choices"] = choices
        out["usage"] = _usage(len(prepared.prompt_ids), sum(len(r.token_ids) for r in rows))
        if req.sampling.return_token_ids:
            out["prompt_token_ids"] = prepared.prompt_ids
        return out

    def _message(self, req: ChatRequest, prepared: _Prepared, row: Sequence) -> tuple[dict, list[dict]]:
        text = self.text_of(row)
        calls: list[dict] = []
        content: str | None = text
        if prepared.tools_active:
            content, calls = parse_tool_calls(text, allowed=prepared.allowed)
            if calls and not req.parallel_tool_calls:
                calls = calls[:1]
        message: dict[str, Any] = {"role": "assistant", "content": content if calls else text}
        if calls:
            message["tool_calls"] = calls
        return message, calls

    def _chat_logprobs(self, row: Sequence) -> list[dict]:
        entries = []
        for token, logprob, top in zip(row.token_ids, row.logprobs, row.top_logprobs, strict=False):
            entries.append({**self._lp_entry(token, logprob), "top_logprobs": [self._lp_entry(t, v) for t, v in top]})
        return entries

    def _lp_entry(self, token: int, logprob: float) -> dict:
        text = self.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    async def chat_stream(self, req: ChatRequest) -> AsyncIterator[bytes]:
        """Validate and start a streamed chat; the iterator yields SSE ``data:`` lines."""
        prepared = self.render_chat(req)
        params = self._params(req.sampling, len(prepared.prompt_ids), req.top_logprobs, "messages")
        rows = self._rows(prepared.prompt_ids, params, req.sampling.n, prepared.forced_ids, model=req.model)
        return self._chat_events(req, prepared, rows)

    async def _chat_events(self, req: ChatRequest, prepared: _Prepared, rows: list[Sequence]) -> AsyncIterator[bytes]:
        base = self._envelope("chatcmpl", "chat.completion.chunk", req.model, rows)
        holdback = max((len(s) for s in req.sampling.stop), default=1) - 1
        for i in range(len(rows)):
            chunk = {
                **base,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
            if req.sampling.return_token_ids:
                chunk["prompt_token_ids"] = prepared.prompt_ids
            yield data_event(chunk)
        streams = [
            ChatDeltas(tools_active=prepared.tools_active, allowed=prepared.allowed, parallel=req.parallel_tool_calls)
            for _ in rows
        ]
        async for i, row, token, logprob, behaviour, top, finish in self._stream(rows):
            if finish is None:
                delta = streams[i].step(
                    _stable_text(self.tokenizer.decode(row.token_ids, skip_special_tokens=True), holdback)
                )
            else:
                delta, finish = streams[i].last(*self._message(req, prepared, row), self.text_of(row), finish)
            choice: dict[str, Any] = {
                "index": i,
                "delta": delta,
                "logprobs": {
                    "content": [
                        {**self._lp_entry(token, logprob), "top_logprobs": [self._lp_entry(t, v) for t, v in top]}
                    ]
                }
                if req.logprobs
                else None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = row.stop_str
            if req.sampling.return_token_ids:
                choice["token_ids"] = [token]
                choice["behaviour_logprobs"] = [behaviour]
            yield data_event({**base, "choices": [choice]})
        if req.sampling.include_usage:
            usage = _usage(len(prepared.prompt_ids), sum(len(r.token_ids) for r in rows))
            yield data_event({**base, "choices": [], "usage": usage})
        yield DONE_EVENT

    # -- completions ----------------------------------------------------------------------

    def _completion_rows(self, req: CompletionRequest) -> list[tuple[list[int], list[Sequence]]]:
        groups = []
        top = req.logprobs or 0
        for prompt in req.prompts:
            ids = self.encode_prompt(prompt)
            params = self._params(req.sampling, len(ids), top, "prompt")
            groups.append((ids, self._rows(ids, params, req.sampling.n, [], model=req.model)))
        return groups

    async def completion(self, req: CompletionRequest) -> dict:
        groups = self._completion_rows(req)
        all_rows = [row for _, rows in groups for row in rows]
        await self._generate(all_rows)
        choices = []
        for ids, rows in groups:
            for row in rows:
                choice: dict[str, Any] = {
                    "index": len(choices),
                    "text": self.text_of(row),
                    "logprobs": self._completion_logprobs(row) if req.logprobs is not None else None,
                    "finish_reason": row.finish_reason,
                    "stop_reason": row.stop_str,
                }
                if req.sampling.return_token_ids:
                    choice["token_ids"] = row.token_ids
                    choice["behaviour_logprobs"] = row.behaviour_logprobs
                    choice["prompt_token_ids"] = ids
                choices.append(choice)
        out = self._envelope("cmpl", "text_completion", req.model, all_rows)
        out["choices"] = choices
        out["usage"] = _usage(sum(len(ids) for ids, _ in groups), sum(len(r.token_ids) for r in all_rows))
        return out

    def _completion_logprobs(self, row: Sequence) -> dict:
        tokens = [self.token_text(t) for t in row.token_ids]
        offsets, at = [], 0
        for text in tokens:
            offsets.append(at)
            at += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": row.logprobs,
            "top_logprobs": [{self.token_text(t): v for t, v in top} for top in row.top_logprobs],
            "text_offset": offsets,
        }

    async def completion_stream(self, req: CompletionRequest) -> AsyncIterator[bytes]:
        groups = self._completion_rows(req)
        return self._completion_events(req, groups)

    async def _completion_events(self, req: CompletionRequest, groups) -> AsyncIterator[bytes]:
        rows = [row for _, rows in groups for row in rows]
        prompts = [ids for ids, group in groups for _ in group]
        base = self._envelope("cmpl", "text_completion", req.model, rows)
        holdback = max((len(s) for s in req.sampling.stop), default=1) - 1
        sent = [""] * len(rows)
        first = [True] * len(rows)
        async for i, row, token, logprob, behaviour, top, finish in self._stream(rows):
            text = (
                self.text_of(row)
                if finish
                else _stable_text(self.tokenizer.decode(row.token_ids, skip_special_tokens=True), holdback)
            )
            piece = text[len(sent[i]) :] if text.startswith(sent[i]) else ""
            sent[i] += piece
            choice: dict[str, Any] = {"index": i, "text": piece, "finish_reason": finish, "logprobs": None}
            if finish is not None:
                choice["stop_reason"] = row.stop_str
            if req.logprobs is not None:
                choice["logprobs"] = {
                    "tokens": [self.token_text(token)],
                    "token_logprobs": [logprob],
                    "top_logprobs": [{self.token_text(t): v for t, v in top}],
                    "text_offset": [0],
                }
            if req.sampling.return_token_ids:
                choice["token_ids"] = [token]
                choice["behaviour_logprobs"] = [behaviour]
                if first[i]:
                    choice["prompt_token_ids"] = prompts[i]
            first[i] = False
            yield data_event({**base, "choices": [choice]})
        if req.sampling.include_usage:
            yield data_event(
                {
                    **base,
                    "choices": [],
                    "usage": _usage(sum(len(ids) for ids, _ in groups), sum(len(r.token_ids) for r in rows)),
                }
            )
        yield DONE_EVENT

    # -- plumbing -------------------------------------------------------------------------

    async def _generate(self, rows: list[Sequence]) -> list[Sequence]:
        future = self.batcher.submit(rows)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            for row in rows:
                row.cancelled = True
            raise

    async def _stream(self, rows: list[Sequence]):
        """Yield (choice index, row, token, logprob, behaviour logprob, top, finish_reason) as tokens come out."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        index = {id(row): i for i, row in enumerate(rows)}

        def on_token(row: Sequence) -> None:
            event = (
                index[id(row)],
                row.token_ids[-1],
                row.logprobs[-1],
                row.behaviour_logprobs[-1],
                row.top_logprobs[-1],
                row.finish_reason,
            )
            loop.call_soon_threadsafe(events.put_nowait, event)

        for row in rows:
            row.on_token = on_token
        future = self.batcher.submit(rows)
        finished = asyncio.wrap_future(future)
        done = 0
        try:
            while done < len(rows):
                if events.empty():
                    if finished.done():
                        # the worker queues every token event before it resolves the future
                        finished.result()
                        break
                    getter = asyncio.ensure_future(events.get())
                    await asyncio.wait({getter, finished}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                    event = getter.result()
                else:
                    event = events.get_nowait()
                i, token, logprob, behaviour, top, finish = event
                if finish is not None:
                    done += 1
                yield i, rows[i], token, logprob, behaviour, top, finish
        finally:
            if done < len(rows):
                for row in rows:
                    row.cancelled = True

    def _envelope(self, prefix: str, kind: str, model: str, rows: list[Sequence]) -> dict:
        version = rows[0].model_version if rows and rows[0].model_version else self.version_for(model)
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": model or self.model_name,
            "model_version": version,
        }


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _stable_text(text: str, holdback: int) -> str:
    """Text safe to stream: no trailing partial character, and room left for a stop string."""
    text = text.rstrip("\ufffd")
    return text[: len(text) - holdback] if holdback > 0 else text
