"""What the load generator sends: ``RequestSpec`` (one request, not yet timed) and its OpenAI payload.

A workload turns into an iterator of ``RequestSpec``; a scheduler gives the times. ``build_payload`` maps a
spec to a ``/v1/completions`` (token ids or text) or ``/v1/chat/completions`` (text) body. By default it
asks for exact output lengths (``ignore_eos`` + ``min_tokens``, understood by vLLM and the sim engine) and
for a running ``usage`` in every chunk, so tokens per chunk come from the server. ``completion_body`` is
that body for a bare prompt: the one OpenAI request body of the suite (the sweep's and the transfer
benchmark's probes and streams send it too).
A drawn request may come as a draft (``build_prompt`` set, ``prompt`` empty): its lengths and labels are
known, its prompt is made by ``built()``. The load generator builds only the requests it sends, so a
worker among N skips the others' shares of a plan for the price of their lengths (a cold prompt is
counted, not drawn in turn: ``microbench.workloads.prompts``). ``build_payload`` refuses a draft.
A multi-turn request carries ``next_turn``: given the finished round's ``StreamRecord`` it returns the
next round (or None), which the session sends ``think_time_s`` after the response ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import Field

from benchcore.schema import StrictModel
from microbench.client.streams import StreamRecord

__all__ = ["ApiSettings", "BuildPrompt", "NextTurn", "RequestSpec", "build_payload", "completion_body"]

NextTurn = Callable[["RequestSpec", StreamRecord], "RequestSpec | None"]
BuildPrompt = Callable[[], "tuple[list[int] | str, int]"]  # a draft's prompt and its token count


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: prompt, output budget and the workload labels that go into its trace row."""

    prompt: list[int] | str
    prompt_tokens: int
    max_tokens: int
    client_id: str = "default"
    tenant_id: str = ""
    slo_class: str = ""
    prefix_group: str = ""
    prefix_tokens: int = 0
    session_id: str = ""
    round_index: int = 0
    streaming: bool = True
    sampling: Mapping[str, Any] = field(default_factory=dict)
    next_turn: NextTurn | None = None
    think_time_s: float = 0.0
    # a draft: ``prompt`` is empty and ``prompt_tokens`` the asked length until ``built()``
    build_prompt: BuildPrompt | None = None
    clipped: bool = False  # its lengths were shortened to fit the engine's context (``max_model_len``)

    def built(self) -> RequestSpec:
        """This request with its prompt made (itself when it has one); the token count is the prompt's."""
        if self.build_prompt is None:
            return self
        prompt, tokens = self.build_prompt()
        return replace(self, prompt=prompt, prompt_tokens=tokens, build_prompt=None)


class ApiSettings(StrictModel):
    """How requests reach the engine: endpoint family, model name and what every body carries."""

    model: str = Field(..., description="the engine's served model name")
    api: Literal["completions", "chat"] = Field(default="completions", description="chat needs text prompts")
    exact_output_length: bool = Field(
        default=True,
        description="send ignore_eos and min_tokens = max_tokens so outputs have the asked length",
    )
    continuous_usage: bool = Field(
        default=True, description="ask for usage in every chunk (tokens per chunk)"
    )
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every request body")

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"


def completion_body(
    model: str,
    prompt: list[int] | str,
    max_tokens: int,
    *,
    exact_output_length: bool = True,
    stream_usage: bool | None = True,
    **extra: Any,
) -> dict[str, Any]:
    """A ``/v1/completions`` body: ``model``, ``prompt``, ``max_tokens``, then the suite's options.

    ``exact_output_length``: ``ignore_eos`` and ``min_tokens = max_tokens``, so the output has the asked
    length. ``stream_usage``: ask for ``usage`` in the stream (True: in every chunk, False: at its end,
    None: no ``stream_options``, for a request that does not stream). ``extra`` (sampling, say
    ``temperature=0``) is merged last. ``stream`` is set by the caller.
    """
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    if exact_output_length:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if stream_usage is not None:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": stream_usage}
    body.update(extra)
    return body


def build_payload(spec: RequestSpec, api: ApiSettings) -> dict[str, Any]:
    """The JSON body for ``spec`` (``stream`` is set by the caller)."""
    if spec.build_prompt is not None:
        raise ValueError("a draft RequestSpec has no prompt yet: send spec.built()")
    if api.api == "chat" and not isinstance(spec.prompt, str):
        raise ValueError("the chat API needs text prompts; use api='completions' for token ids")
    body = completion_body(
        api.model,
        spec.prompt,
        spec.max_tokens,
        exact_output_length=api.exact_output_length,
        stream_usage=api.continuous_usage if spec.streaming else None,
        **{**spec.sampling, **api.extra_body},
    )
    if api.api == "chat":
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    return body
