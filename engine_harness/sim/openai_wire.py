"""OpenAI-compatible wire format as vLLM 0.32 writes it: request parsing, SSE chunks, bodies, errors (pure).

The shapes mirror ``tests/fixtures/vllm_cpu_completions_stream.txt`` and ``…_chat_stream.txt``: field
names and order, ``cmpl-``/``chatcmpl-`` ids, one chunk per generated token, the finishing token's chunk
carrying ``finish_reason``, then (with ``stream_options.include_usage``) a usage-only chunk with
``choices: []``, then ``data: [DONE]``. With ``continuous_usage_stats`` every chunk carries ``usage``
with the running ``completion_tokens``. Chunks are assembled from pre-encoded pieces (this runs once per
token, so it is kept cheap).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from engine_harness.sim.tokenizer import encode, encode_chat

__all__ = [
    "DONE_EVENT",
    "CompletionParams",
    "Kind",
    "RequestError",
    "StreamEncoder",
    "completion_body",
    "error_body",
    "loads",
    "new_request_id",
    "parse_request",
    "usage_dict",
]

Kind = Literal["completion", "chat"]
DONE_EVENT = b"data: [DONE]\n\n"
DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class RequestError(ValueError):
    """A request the engine refuses; ``status`` and ``error_type`` go into vLLM's error body."""

    def __init__(self, message: str, status: int = 400, error_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


def error_body(message: str, status: int, error_type: str) -> dict[str, Any]:
    """vLLM's JSON error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


@dataclass(frozen=True)
class CompletionParams:
    """What the engine needs from one /v1/completions or /v1/chat/completions request."""

    kind: Kind
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool


def loads(text: str) -> Any:
    """``json.loads``'s result at msgspec's speed (13 µs a short request body with json, 3.5 with msgspec);
    what msgspec refuses (NaN, a lone surrogate, a float past its range) ``json`` decides, as before."""
    try:
        return msgspec.json.decode(text)
    except ValueError:
        return json.loads(text)


def _int_field(body: Mapping[str, Any], name: str, default: int | None, lo: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {value!r}")
    if value < lo:
        raise RequestError(f"'{name}' must be at least {lo}, got {value}")
    return value


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return encode(prompt)
    # a JSON body's token ids are ints (a bool is none): checked at C speed (per-item generators took 10 µs
    # for 16 tokens, ms for long prompts)
    if isinstance(prompt, list) and {*map(type, prompt)} <= {int}:
        if prompt and min(prompt) < 0:
            raise RequestError("token ids in 'prompt' must be non-negative")
        return list(prompt)
    raise RequestError("'prompt' must be a string or a list of token ids (one prompt per request)")


def parse_request(kind: Kind, body: Any, served_model: str, context_limit: int) -> CompletionParams:
    """Validate a request body like vLLM does; raises ``RequestError`` with vLLM's status and wording."""
    if not isinstance(body, Mapping):
        raise RequestError("request body must be a JSON object")
    model = body.get("model", served_model)
    if model != served_model:
        raise RequestError(f"The model `{model}` does not exist.", 404, "NotFoundError")
    if body.get("n", 1) != 1:
        raise RequestError("the sim supports n=1 only")
    if kind == "completion":
        if "prompt" not in body:
            raise RequestError("'prompt' is required")
        ids = _prompt_ids(body["prompt"])
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list")
        try:
            ids = encode_chat(messages, bool(body.get("add_generation_prompt", True)))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
    if not ids:
        raise RequestError("the prompt is empty")
    if len(ids) >= context_limit:
        raise RequestError(
            f"This model's maximum context length is {context_limit} tokens. However, your request has "
            f"{len(ids)} input tokens. Please reduce the length of the input."
        )
    if kind == "completion":
        max_tokens = _int_field(body, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, 1)
    else:
        max_tokens = _int_field(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", None, 1)
    if max_tokens is None:
        max_tokens = context_limit - len(ids)
    if len(ids) + max_tokens > context_limit:
        raise RequestError(
            f"This model's maximum context length is {context_limit} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} in the completion). "
            "Please reduce the length of the prompt or completion."
        )
    min_tokens = _int_field(body, "min_tokens", 0, 0) or 0
    if min_tokens > max_tokens:
        raise RequestError(f"min_tokens ({min_tokens}) must be at most max_tokens ({max_tokens})")
    stream = bool(body.get("stream", False))
    options = body.get("stream_options")
    if options is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.")
    options = options if isinstance(options, Mapping) else {}
    include_usage = bool(options.get("include_usage", False))
    return CompletionParams(
        kind=kind,
        model=str(model),
        prompt_token_ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options.get("continuous_usage_stats", False)),
    )


def new_request_id(kind: Kind) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + os.urandom(8).hex()  # as uuid4().hex[:16]


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_JSON_TEXT = {chr(i): _dump(chr(i)) for i in range(128)} | {"": '""'}  # one generated token's text


class StreamEncoder:
    """SSE events of one streaming request, in vLLM's exact layout."""

    def __init__(
        self,
        kind: Kind,
        request_id: str,
        created: int,
        model: str,
        prompt_tokens: int,
        include_usage: bool,
        continuous_usage: bool,
        fingerprint: str,
    ) -> None:
        self.kind = kind
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        self._head = (
            f'data: {{"id":"{request_id}","object":"{obj}","created":{created},"model":{_dump(model)},'
        )
        self._fingerprint = _dump(fingerprint)
        if kind == "completion":
            self._open = '"choices":[{"index":0,"text":'
            self._close = (
                ',"logprobs":null,"finish_reason":%s,"stop_reason":null,'
                '"prompt_token_ids":null,"token_ids":null}]'
            )
        else:
            self._open = '"choices":[{"index":0,"delta":{"content":'
            self._close = '},"logprobs":null,"finish_reason":%s,"token_ids":null}]'
            self._close_last = '},"logprobs":null,"finish_reason":%s,"stop_reason":null,"token_ids":null}]'
        self._close_open = self._close % "null"

    def _usage(self, completion_tokens: int, cached_tokens: int | None) -> str:
        p = self.prompt_tokens
        details = (
            "" if cached_tokens is None else f',"prompt_tokens_details":{{"cached_tokens":{cached_tokens}}}'
        )
        n = completion_tokens
        return f'{{"prompt_tokens":{p},"total_tokens":{p + n},"completion_tokens":{n}{details}}}'

    def role_event(self, cached_tokens: int | None = None) -> bytes:
        """Chat only: the first event, ``delta: {role: assistant, content: ""}``."""
        usage = f',"usage":{self._usage(0, cached_tokens)}' if self.continuous_usage else ""
        return (
            f'{self._head}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,'
            f'"finish_reason":null}}],"prompt_token_ids":null,"prompt_text":null{usage}}}\n\n'
        ).encode()

    def token_event(
        self, text: str, completion_tokens: int, finish_reason: str | None, cached_tokens: int | None = None
    ) -> bytes:
        """One generated token; ``completion_tokens`` counts it."""
        if finish_reason is None:
            close = self._close_open
        else:
            close = (self._close if self.kind == "completion" else self._close_last) % f'"{finish_reason}"'
        usage = f',"usage":{self._usage(completion_tokens, cached_tokens)}' if self.continuous_usage else ""
        text_json = _JSON_TEXT.get(text) or _dump(text)
        return f"{self._head}{self._open}{text_json}{close}{usage}}}\n\n".encode()

    def usage_event(self, completion_tokens: int, cached_tokens: int | None = None) -> bytes:
        """The usage-only event after the last token (``choices: []``)."""
        return (
            f'{self._head}"choices":[],"usage":{self._usage(completion_tokens, cached_tokens)},'
            f'"system_fingerprint":{self._fingerprint}}}\n\n'
        ).encode()


def completion_body(
    kind: Kind,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The non-streaming response body."""
    if kind == "completion":
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
        }
        obj = "chat.completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }
