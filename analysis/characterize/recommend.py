"""Seed 001's last step on our data: per model, the configuration (device × settings) that serves N users
within the SLO at the lowest cost per user.

Per configuration (``curves.slo_capacity``: isotonic fits, monotone in users) a capacity C is read; N users
then need ⌈N / C⌉ devices (replicas), costing that many times the configuration's price per device-hour;
the cost per user-hour divides by N. Never a silent extrapolation:

- C is only read inside the measured users range; a configuration meeting the SLO at its largest measured
  level U (C ≥ U, censored) and asked for N > U is costed at U users per device and the answer says that
  N lies beyond what was measured (one device may serve more: measure up to N to know);
- a configuration missing the SLO at its fewest measured users serves nobody within it (monotone: more
  users only make it slower), so it is left out with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
from pydantic import Field

from analysis.characterize.curves import Capacity, capacities
from benchcore.schema import StrictModel

__all__ = ["Choice", "NothingMeets", "Recommendation", "parse_costs", "recommend"]


class NothingMeets(ValueError):
    """No configuration of a model meets the SLO at any measured load; the message gives the best seen."""


class Choice(StrictModel):
    """One configuration's answer for N users."""

    config: str
    device: str
    capacity: int | None
    censored: bool
    devices: int | None = Field(..., description="replicas needed for N users (None: cannot serve them)")
    usd_per_hour: float | None
    usd_per_user_hour: float | None
    note: str


class Recommendation(StrictModel):
    """Per model: the cheapest configuration and every configuration's answer, cheapest first."""

    model: str
    users: int
    best: str | None
    choices: list[Choice]


def parse_costs(items: list[str]) -> dict[str, float]:
    """``CFG_OR_DEVICE=USD_PER_HOUR`` items (repeated flag or comma-separated) → a price table."""
    out: dict[str, float] = {}
    for item in (p.strip() for text in items for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not key or not price >= 0 or not math.isfinite(price):
            raise ValueError(
                f"--cost {item!r}: want CONFIG=USD_PER_HOUR (or DEVICE=USD_PER_HOUR), e.g. a100=3.2"
            )
        out[key] = price
    return out


def _price(config: str, device: str, costs: Mapping[str, float]) -> float:
    if config in costs:
        return costs[config]
    if device in costs:
        return costs[device]
    raise KeyError(
        f"no cost for configuration {config!r} (device {device!r}): add --cost {config}=USD_PER_HOUR"
    )


def _choice(cap: Capacity, device: str, users: int, costs: Mapping[str, float], slo_text: str) -> Choice:
    price = _price(cap.config, device, costs)
    if cap.users is None:
        note = (
            f"misses the SLO ({cap.limiting or slo_text}) already at {cap.min_measured} users, its fewest "
            "measured; more users only make it slower"
        )
        return Choice(
            config=cap.config,
            device=device,
            capacity=None,
            censored=False,
            devices=None,
            usd_per_hour=None,
            usd_per_user_hour=None,
            note=note,
        )
    per_device = cap.users
    if users <= cap.users:
        note = f"one device serves {users} users within the SLO (capacity {cap.users}"
        note += "+, the SLO held at every measured level)" if cap.censored else ")"
    elif cap.censored:
        note = (
            f"{users} users lie beyond the largest measured level ({cap.max_measured}): costed at "
            f"{cap.max_measured} users per device, as measured; one device may serve more (not "
            f"extrapolated): "
            f"measure up to {users} users to know"
        )
    else:
        note = f"capacity {cap.users} users per device ({cap.limiting} binds next)"
    devices = math.ceil(users / per_device)
    return Choice(
        config=cap.config,
        device=device,
        capacity=cap.users,
        censored=cap.censored,
        devices=devices,
        usd_per_hour=devices * price,
        usd_per_user_hour=devices * price / users,
        note=note,
    )


def recommend(
    table: pd.DataFrame,
    slo: Mapping[str, float],
    users: int,
    costs: Mapping[str, float],
    percentile: str = "p90",
) -> list[Recommendation]:
    """A recommendation per model (``KeyError`` for a missing price, ``NothingMeets`` when no configuration
    of a model meets the SLO at any measured load)."""
    if users < 1:
        raise ValueError(f"--users {users}: at least 1")
    slo_text = ", ".join(f"{k} ≤ {v * 1e3:g} ms" for k, v in slo.items())
    out: list[Recommendation] = []
    for model, rows in table.groupby("model", sort=True):
        devices = rows.groupby("config")["device"].first().to_dict()
        choices = [
            _choice(c, str(devices[c.config]), users, costs, slo_text)
            for c in capacities(rows, slo, percentile)
        ]
        served = sorted(
            (c for c in choices if c.usd_per_user_hour is not None), key=lambda c: c.usd_per_user_hour or 0
        )
        if not served:
            best_seen = {
                k: float(rows[f"{k}_{percentile}"].min()) * 1e3
                for k in slo
                if rows[f"{k}_{percentile}"].notna().any()
            }
            seen = ", ".join(f"{k} {percentile} {v:.3g} ms" for k, v in best_seen.items())
            raise NothingMeets(
                f"model {model}: no configuration meets the SLO ({slo_text}, {percentile}) at any measured "
                f"load; the best measured: {seen}. Loosen the SLO or measure other settings/devices"
            )
        rest = [c for c in choices if c.usd_per_user_hour is None]
        out.append(
            Recommendation(model=str(model), users=users, best=served[0].config, choices=served + rest)
        )
    return out
