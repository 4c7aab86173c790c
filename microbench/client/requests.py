"""What the load generator sends: ``RequestSpec`` (one request, not yet timed) and its OpenAI payload.

A workload turns into an iterator of ``RequestSpec``; a scheduler gives the times. ``build_payload`` maps a
spec to a ``/v1/completions`` (token ids or text) or ``/v1/chat/completions`` (text) body. By default it
asks for exact output lengths (``ignore_eos`` + ``min_tokens``, understood by vLLM and the sim engine) and
for a running ``usage`` in every chunk, so tokens per chunk come from the server.
A multi-turn request carries ``next_turn``: given the finished round's ``StreamRecord`` it returns the
next round (or None), which the session sends ``think_time_s`` after the response ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from benchcore.schema import StrictModel
from microbench.client.streams import StreamRecord

__all__ = ["ApiSettings", "NextTurn", "RequestSpec", "build_payload"]

NextTurn = Callable[["RequestSpec", StreamRecord], "RequestSpec | None"]


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


def build_payload(spec: RequestSpec, api: ApiSettings) -> dict[str, Any]:
    """The JSON body for ``spec`` (``stream`` is set by the caller)."""
    body: dict[str, Any] = {"model": api.model, "max_tokens": spec.max_tokens, **spec.sampling}
    if api.api == "chat":
        if not isinstance(spec.prompt, str):
            raise ValueError("the chat API needs text prompts; use api='completions' for token ids")
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if api.exact_output_length:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.max_tokens
    if spec.streaming:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": api.continuous_usage}
    body.update(api.extra_body)
    return body
