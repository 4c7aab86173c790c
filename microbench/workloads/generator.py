"""A ``WorkloadSpec`` made runnable: seeded request streams and self-timed plans for the load generator.

``Workload.requests()`` yields ``RequestSpec`` drafts endlessly: each one's client is drawn by rate
fraction, its lengths from the client's distributions, its prefix (if any) by the prefix group's
popularity. Lengths, client and prefix choices come only from the spec's ``seed``; token ids come from the
``PromptFactory`` (whose salt makes cold prompts unique per run), made only when the request is built
(``RequestSpec.built``: the load generator builds the requests it sends, no others). ``Workload.plan()``
yields ``(offset_ns, RequestSpec)`` with every client's own arrival process at its share of the aggregate
rate, only inside its windows. Both can ``skip()`` an item: its draws and request number are taken, its
draft is not made, so a worker among N passes the others' items for about 1 µs each where a draft costs 4
(``microbench.loadgen.stages.share_of``; ``scripts/bench_plan_share.py``).

With ``max_model_len`` a request that would not fit (prefix + input + output) gets its input, then its
output, shortened, and says so (``RequestSpec.clipped``: the trace header counts the sent ones, whichever
worker sent them); an accumulating conversation whose next round would not fit ends there (its rounds in
the trace show it). Multi-turn clients draw all rounds'
lengths up front (so runs stay reproducible); a later round's prompt is the earlier prompt, a stand-in for
the answer of the length the server reported (fresh ids; the answer's own ids are not returned; text
prompts use the answer's text), and a new question.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from microbench.client.requests import RequestSpec
from microbench.client.streams import StreamRecord
from microbench.workloads.distributions import EmpiricalDist, paired_sample
from microbench.workloads.prompts import PromptFactory, TextRenderer, as_prompt
from microbench.workloads.spec import ClientSpec, WorkloadSpec

__all__ = ["Workload"]

_NS = 1_000_000_000
_BLOCK = 256  # requests drawn per block of each client


@dataclass(frozen=True)
class _Turns:
    """The pre-drawn rounds of one conversation: question and output lengths per later round."""

    session_id: str
    questions: tuple[int, ...]
    outputs: tuple[int, ...]
    think_time_s: float
    accumulate: bool


class Workload:
    """Requests of a spec, for a scheduler (``requests``) or timed by the spec itself (``plan``)."""

    def __init__(
        self,
        spec: WorkloadSpec,
        prompts: PromptFactory | None = None,
        *,
        text: TextRenderer | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.spec = spec
        self.prompts = prompts or PromptFactory()
        self.text = text
        self.max_model_len = max_model_len
        self._prefix_lengths = {
            c.prefix.group: c.prefix.length.sample(self._rng(1, i), c.prefix.count).tolist()
            for i, c in enumerate(spec.clients)
            if c.prefix is not None
        }
        self._prefix_weights = [self._popularity(c) for c in spec.clients]

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.spec.seed, *key])

    @staticmethod
    def _popularity(client: ClientSpec) -> np.ndarray | None:
        if client.prefix is None:
            return None
        ranks = np.arange(1, client.prefix.count + 1, dtype=float)
        weights = ranks ** -(client.prefix.zipf_s or 0.0)
        return weights / weights.sum()

    def requests(self) -> _Mixed:
        """Endless requests, clients mixed by ``rate_fraction``."""
        fractions = np.array([c.rate_fraction for c in self.spec.clients])
        return _Mixed(self._rng(2), fractions / fractions.sum(), self._client_drafts())

    def plan(self, duration_s: float, aggregate_rate: float | None = None) -> _Timed:
        """Timed requests for ``duration_s``: each client's arrivals at its share of the aggregate rate."""
        rate = aggregate_rate or self.spec.aggregate_rate
        if rate is None:
            raise ValueError(f"workload {self.spec.name!r} has no aggregate_rate; pass one")
        total = sum(c.rate_fraction for c in self.spec.clients)
        streams = [
            self._client_times(i, rate * c.rate_fraction / total, duration_s)
            for i, c in enumerate(self.spec.clients)
        ]
        merged = heapq.merge(*(zip(times, itertools.repeat(i)) for i, times in enumerate(streams)))
        return _Timed(merged, self._client_drafts())

    def _client_times(self, index: int, rate: float, duration_s: float) -> Iterator[int]:
        client = self.spec.clients[index]
        windows = [(w.start_s, min(w.end_s, duration_s)) for w in client.windows] or [(0.0, duration_s)]
        for w, (start_s, end_s) in enumerate(windows):
            if end_s <= start_s:
                continue
            scheduler = client.arrival.scheduler(rate, seed=self.spec.seed * 1000 + index * 100 + w)
            span_ns, start_ns = int((end_s - start_s) * _NS), int(start_s * _NS)
            for offset in scheduler.offsets_ns():
                if offset >= span_ns:
                    break
                yield start_ns + offset

    def _client_drafts(self) -> list[_ClientDrafts]:
        return [_ClientDrafts(self, i) for i in range(len(self.spec.clients))]

    @staticmethod
    def _lengths(client: ClientSpec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` input and ``n`` output lengths: drawn independently, or as pairs (``paired_lengths``)."""
        if client.paired_lengths:
            assert isinstance(client.input_length, EmpiricalDist) and isinstance(
                client.output_length, EmpiricalDist
            )
            return paired_sample(client.input_length, client.output_length, rng, n)
        return client.input_length.sample(rng, n), client.output_length.sample(rng, n)

    def _fit(self, prefix_len: int, input_len: int, output_len: int) -> tuple[int, int, bool]:
        """Input and output lengths shortened (input first) so the request fits ``max_model_len``, and
        whether they were."""
        if self.max_model_len is None or prefix_len + input_len + output_len <= self.max_model_len:
            return input_len, output_len, False
        room = self.max_model_len - prefix_len
        output_len = max(1, min(output_len, room - 1))
        return max(1, room - output_len), output_len, True

    def _first_round(
        self,
        client: ClientSpec,
        item: int,
        prefix_index: int,
        input_len: int,
        output_len: int,
        turns: _Turns | None,
    ) -> RequestSpec:
        """A draft (``RequestSpec.built`` makes its prompt): its lengths and labels, and its number."""
        group, prefix_len = "", 0
        if prefix_index >= 0 and client.prefix is not None:
            group = client.prefix.group
            prefix_len = int(self._prefix_lengths[group][prefix_index])
        input_len, output_len, clipped = self._fit(prefix_len, input_len, output_len)
        prefix = (group, prefix_index, prefix_len)
        return RequestSpec(
            prompt=[],
            prompt_tokens=prefix_len + input_len,
            max_tokens=output_len,
            client_id=client.id,
            tenant_id=client.tenant_id,
            slo_class=client.slo_class,
            prefix_group=f"{group}/{prefix_index}" if group else "",
            prefix_tokens=prefix_len,
            session_id=turns.session_id if turns else "",
            streaming=client.streaming,
            sampling=dict(client.sampling),
            next_turn=None if turns is None else functools.partial(self._next_round, turns, item, prefix),
            think_time_s=0.0 if turns is None else turns.think_time_s,
            build_prompt=functools.partial(self._first_prompt, item, prefix, input_len),
            clipped=clipped,
        )

    def _prefix(self, prefix: tuple[str, int, int]) -> list[int]:
        group, index, length = prefix
        return self.prompts.shared(group, index, length) if group else []

    def _first_prompt(
        self, item: int, prefix: tuple[str, int, int], input_len: int
    ) -> tuple[list[int] | str, int]:
        return as_prompt(self._prefix(prefix) + self.prompts.cold(input_len, item), self.text)

    def _next_round(
        self,
        turns: _Turns,
        item: int,
        prefix: tuple[str, int, int],
        previous: RequestSpec,
        answer: StreamRecord,
    ) -> RequestSpec | None:
        """The round after ``previous`` given its ``answer`` (None once the rounds or the context run out);
        round r's cold parts are the request's parts 1 + 2r (the answer's stand-in) and 2 + 2r (the
        question), so they are the same whichever worker sends the conversation."""
        index = previous.round_index
        if index >= len(turns.questions):
            return None
        question_len, output_len = turns.questions[index], turns.outputs[index]
        answer_part, question_part = 1 + 2 * index, 2 + 2 * index
        prompt: list[int] | str
        if turns.accumulate:
            if isinstance(previous.prompt, str):
                question, _ = as_prompt(self.prompts.cold(question_len, item, question_part), self.text)
                assert isinstance(question, str)
                prompt, n_tokens = self._joined_text(previous.prompt + "".join(answer.text) + question)
            else:
                answer_ids = self.prompts.cold(answer.completion_tokens, item, answer_part)
                ids = previous.prompt + answer_ids + self.prompts.cold(question_len, item, question_part)
                prompt, n_tokens = ids, len(ids)
            if self.max_model_len is not None and n_tokens + output_len > self.max_model_len:
                return None
        else:
            question_ids = self.prompts.cold(question_len, item, question_part)
            prompt, n_tokens = as_prompt(self._prefix(prefix) + question_ids, self.text)
        return dataclasses.replace(
            previous,
            prompt=prompt,
            prompt_tokens=n_tokens,
            max_tokens=output_len,
            round_index=index + 1,
            clipped=False,
        )

    def _joined_text(self, text: str) -> tuple[str, int]:
        assert self.text is not None
        return text, len(self.text.tokenizer.encode(text))


class _ClientDrafts:
    """One client's endless drafts, its lengths and prefix choices drawn in blocks (cheap per request).
    ``skip()`` passes one by without making it: its draws and its request number are still taken, so the
    next draft is the one ``next()`` would have given (a worker skips the items other workers send)."""

    def __init__(self, workload: Workload, index: int) -> None:
        self._workload = workload
        self._index = index
        self._client = workload.spec.clients[index]
        self._rng = workload._rng(3, index)
        multi = self._client.multi_turn
        self._rounds = multi.max_rounds - 1 if multi is not None else 0
        self._drawn = 0  # drafts taken or skipped
        self._k = _BLOCK
        self._prefix: list[int] = []
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._questions: np.ndarray = np.empty((0, 0), dtype=int)
        self._answers: np.ndarray = np.empty((0, 0), dtype=int)

    def _draw_block(self) -> None:
        client, rng, workload = self._client, self._rng, self._workload
        prefix_index = np.full(_BLOCK, -1)
        if client.prefix is not None:
            carries = rng.random(_BLOCK) < client.prefix.fraction
            picks = rng.choice(client.prefix.count, size=_BLOCK, p=workload._prefix_weights[self._index])
            prefix_index = np.where(carries, picks, -1)
        inputs, outputs = workload._lengths(client, rng, _BLOCK)
        self._prefix, self._inputs, self._outputs = prefix_index.tolist(), inputs.tolist(), outputs.tolist()
        self._questions, self._answers = (
            x.reshape(_BLOCK, self._rounds) for x in workload._lengths(client, rng, _BLOCK * self._rounds)
        )
        self._k = 0

    def _take(self) -> int:
        """The next draft's place in its block (a new block drawn when one runs out)."""
        if self._k == _BLOCK:
            self._draw_block()
        k, self._k = self._k, self._k + 1
        self._drawn += 1
        return k

    def skip(self) -> None:
        self._take()
        self._workload.prompts.item()

    def __iter__(self) -> _ClientDrafts:
        return self

    def __next__(self) -> RequestSpec:
        k = self._take()
        client, turns = self._client, None
        if self._rounds:
            assert client.multi_turn is not None
            turns = _Turns(
                session_id=f"{client.id}-{self._drawn - 1}",
                questions=tuple(self._questions[k].tolist()),
                outputs=tuple(self._answers[k].tolist()),
                think_time_s=client.multi_turn.think_time_s,
                accumulate=client.multi_turn.context_growth == "accumulate",
            )
        item = self._workload.prompts.item()
        return self._workload._first_round(
            client, item, self._prefix[k], self._inputs[k], self._outputs[k], turns
        )


class _Mixed:
    """Endless drafts of every client, each drawn by rate fraction (``Workload.requests``); ``skip()``
    passes one by as ``_ClientDrafts.skip`` does."""

    def __init__(self, rng: np.random.Generator, fractions: np.ndarray, makers: list[_ClientDrafts]) -> None:
        self._rng, self._fractions, self._makers = rng, fractions, makers
        self._picks: list[int] = []

    def _maker(self) -> _ClientDrafts:
        if not self._picks:
            picks = self._rng.choice(len(self._makers), size=1024, p=self._fractions)
            self._picks = picks.tolist()[::-1]
        return self._makers[self._picks.pop()]

    def skip(self) -> None:
        self._maker().skip()

    def __iter__(self) -> _Mixed:
        return self

    def __next__(self) -> RequestSpec:
        return next(self._maker())


class _Timed:
    """``(offset_ns, draft)`` in time order, every client at its own arrivals (``Workload.plan``);
    ``skip()`` passes one item by without making its draft and returns its offset."""

    def __init__(self, merged: Iterator[tuple[int, int]], makers: list[_ClientDrafts]) -> None:
        self._merged, self._makers = merged, makers

    def skip(self) -> int:
        offset_ns, index = next(self._merged)
        self._makers[index].skip()
        return offset_ns

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> tuple[int, RequestSpec]:
        offset_ns, index = next(self._merged)
        return offset_ns, next(self._makers[index])
