"""The sweep's requests: a reference workload or client-mix YAML, or an empirical joint length table.

Seed 001 keeps input and output lengths correlated (long prompts tend to get long answers in its traces).
A ``WorkloadSpec`` draws them independently per client, so a table of observed (input, output) pairs
(``JointLengths``: CSV or Parquet with columns ``input_tokens``, ``output_tokens`` and an optional
``weight``) is drawn *row by row*: each request takes one observed pair, seeded. Prompts are cold and
unique either way (``PromptFactory``); lengths are clipped to the engine's ``max_model_len`` like the
workload generator clips them (input first).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.client.requests import RequestSpec
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.reference import load_workload

__all__ = ["JointLengths", "request_source"]


class JointLengths:
    """An empirical joint distribution of (input, output) token counts, drawn one observed pair at a time."""

    def __init__(self, pairs: np.ndarray, weights: np.ndarray, source: str) -> None:
        if pairs.ndim != 2 or pairs.shape[1] != 2 or len(pairs) == 0:
            raise ValueError(f"{source}: no (input_tokens, output_tokens) pairs")
        if (pairs < 1).any():
            raise ValueError(f"{source}: token counts must be at least 1")
        if (weights < 0).any() or weights.sum() <= 0:
            raise ValueError(f"{source}: weights must be non-negative and not all 0")
        self.pairs = pairs.astype(int)
        self.weights = weights / weights.sum()
        self.source = source

    @classmethod
    def read(cls, path: Path) -> JointLengths:
        """A CSV or Parquet table with ``input_tokens``, ``output_tokens`` (and ``weight``) columns."""
        try:
            frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read a length table ({exc})") from None
        missing = {"input_tokens", "output_tokens"} - set(frame.columns)
        if missing:
            raise ValueError(f"{path}: columns {sorted(missing)} missing (has {list(frame.columns)})")
        weights = frame["weight"].to_numpy(float) if "weight" in frame else np.ones(len(frame))
        return cls(frame[["input_tokens", "output_tokens"]].to_numpy(), weights, str(path))

    def correlation(self) -> float:
        """Weighted Pearson correlation of log input and log output lengths (what the table keeps)."""
        x, y = np.log(self.pairs[:, 0]), np.log(self.pairs[:, 1])
        w = self.weights
        mx, my = (w * x).sum(), (w * y).sum()
        cov = (w * (x - mx) * (y - my)).sum()
        sd = np.sqrt((w * (x - mx) ** 2).sum() * (w * (y - my) ** 2).sum())
        return float(cov / sd) if sd > 0 else 0.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` observed pairs, drawn with their weights."""
        return self.pairs[rng.choice(len(self.pairs), size=n, p=self.weights)]

    def requests(
        self, seed: int, prompts: PromptFactory, max_model_len: int | None = None
    ) -> Iterator[RequestSpec]:
        rng = np.random.default_rng(seed)
        while True:
            for inp, out in self.draw(rng, 256).tolist():
                if max_model_len is not None and inp + out > max_model_len:
                    out = max(1, min(out, max_model_len - 2))
                    inp = max(1, max_model_len - out)
                ids = prompts.cold(inp)
                yield RequestSpec(prompt=ids, prompt_tokens=len(ids), max_tokens=out, client_id="joint")


def request_source(
    workload: str, joint: Path | None, seed: int, max_model_len: int | None
) -> tuple[Iterator[RequestSpec], dict[str, object]]:
    """Endless requests and a description of where they come from (for the dataset and manifest)."""
    prompts = PromptFactory()
    if joint is not None:
        table = JointLengths.read(joint)
        about = {
            "kind": "joint",
            "source": str(joint),
            "pairs": len(table.pairs),
            "log_length_correlation": round(table.correlation(), 3),
        }
        return table.requests(seed, prompts, max_model_len), about
    spec = load_workload(workload, max_model_len=max_model_len)
    spec = spec.model_copy(update={"seed": seed}) if seed else spec
    return Workload(spec, prompts, max_model_len=max_model_len).requests(), {
        "kind": "workload",
        "name": spec.name,
    }
