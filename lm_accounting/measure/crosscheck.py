"""Analytic vs live: parameters from the module, FLOPs from fvcore and FlopCounterMode.

A cross-check passes only if every matmul component and every parameter component
agrees exactly, in total and layer by layer, and no counter finds matmul FLOPs
outside the known components.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..analytic.flops import forward_flops
from ..analytic.params import parameter_breakdown
from ..breakdown import Breakdown
from ..config import ModelConfig
from .flops import CounterResult, analytic_key, count_flop_counter, count_fvcore


def live_parameter_counts(model: Any) -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    """``numel`` per analytic key from ``named_parameters()`` (a tied weight is listed once)."""
    by_key: dict[str, int] = {}
    per_layer: dict[str, dict[int, int]] = {}
    for name, param in model.named_parameters():
        key, layer = analytic_key(name.rsplit(".", 1)[0])
        by_key[key] = by_key.get(key, 0) + param.numel()
        if layer is not None:
            per_layer.setdefault(key, {})[layer] = per_layer.get(key, {}).get(layer, 0) + param.numel()
    return by_key, per_layer


def compare(analytic: Breakdown, counted: dict[str, int], per_layer: dict[str, dict[int, int]],
            layers: int, what: str) -> list[str]:
    """Every disagreement, as one readable line naming the component (and layer)."""
    problems = []
    for item in analytic:
        got = counted.get(item.key, 0)
        if got != item.total:
            problems.append(f"{what}: {item.key}: analytic {item.total:,} != counted {got:,}")
        if item.per_layer is not None and item.total:
            for layer in range(layers):
                value = per_layer.get(item.key, {}).get(layer, 0)
                if value != item.per_layer:
                    name = item.key.replace("*", str(layer))
                    problems.append(f"{what}: {name}: analytic {item.per_layer:,} != counted {value:,}")
                    break
    for key in counted.keys() - set(analytic.totals()):
        if counted[key]:
            problems.append(f"{what}: {key}: counted {counted[key]:,} but the analytic model has no such component")
    return problems


@dataclass
class CrossCheck:
    config: ModelConfig
    batch: int
    seq: int
    device: str
    params: Breakdown
    live_params: dict[str, int]
    live_params_per_layer: dict[str, dict[int, int]]
    forward: Breakdown
    counters: list[CounterResult]
    backward: CounterResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def mismatches(self) -> list[str]:
        L = self.config.num_layers
        out = compare(self.params, self.live_params, self.live_params_per_layer, L, "parameters")
        keys = list(self.forward.totals())
        for c in self.counters:
            out += compare(self.forward, c.by_key, c.per_layer, L, c.counter)
            if c.unattributed(keys):
                out.append(f"{c.counter}: {c.unattributed(keys):,} FLOPs counted outside the known components")
        if self.backward is not None:
            bwd = self.backward.total - self.flop_counter.total
            if bwd != 2 * self.forward.total:
                out.append(f"backward: FlopCounterMode {bwd:,} != 2 × analytic forward {2 * self.forward.total:,}")
        return out

    @property
    def flop_counter(self) -> CounterResult:
        return next(c for c in self.counters if c.counter == "FlopCounterMode")

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows (section, key, analytic, each counter, live): the CSV form."""
        names = [c.counter for c in self.counters]
        rows = [{"section": "forward_flops", **row, "live": None} for row in self.to_dict()["forward_flops"]]
        rows += [{"section": "parameters", "key": it.key, "analytic": it.total, **dict.fromkeys(names),
                  "live": self.live_params.get(it.key, 0)} for it in self.params]
        return rows

    def to_frame(self):
        """One row per matmul component: analytic and each counter's FLOPs (pandas imported here)."""
        import pandas as pd

        return pd.DataFrame(self.to_dict()["forward_flops"]).set_index("key")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "lm-accounting/crosscheck/1",
            "config": self.config.resolved(),
            "batch": self.batch,
            "context": self.seq,
            "device": self.device,
            "parameters": [
                {"key": it.key, "analytic": it.total, "live": self.live_params.get(it.key, 0)} for it in self.params
            ],
            "forward_flops": [
                {"key": it.key, "analytic": it.total, **{c.counter: c.by_key.get(it.key, 0) for c in self.counters}}
                for it in self.forward
            ],
            "totals": {"analytic": self.forward.total, **{c.counter: c.total for c in self.counters}},
            "backward": None if self.backward is None else {
                "analytic_2x_forward": 2 * self.forward.total,
                "flop_counter": self.backward.total - self.flop_counter.total,
            },
            "skipped_ops": {c.counter: c.skipped_ops for c in self.counters},
            "seconds": self.seconds,
            "mismatches": self.mismatches(),
        }


def crosscheck(cfg: ModelConfig, seq: int, batch: int = 1, device: str = "meta", backward: bool = False,
               counters: tuple[str, ...] = ("fvcore", "flop_counter")) -> CrossCheck:
    """Build the live model for ``cfg`` on ``device`` and count it every way we can."""
    import torch

    from ..model import build_model, random_tokens

    if backward and "flop_counter" not in counters:
        counters = (*counters, "flop_counter")
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    if device == "cpu":
        torch.manual_seed(0)
    model = build_model(cfg, device=device)
    tokens = random_tokens(cfg, batch, seq, device=device)
    seconds["build"] = time.perf_counter() - start
    live, live_per_layer = live_parameter_counts(model)
    fwd = forward_flops(cfg, seq, batch)
    keys = list(fwd.totals())
    results = []
    for name in counters:
        start = time.perf_counter()
        if name == "fvcore":
            results.append(count_fvcore(model, tokens, keys))
        else:
            results.append(count_flop_counter(model, tokens, keys))
        seconds[name] = time.perf_counter() - start
    bwd = None
    if backward:
        start = time.perf_counter()
        bwd = count_flop_counter(model, tokens, keys, backward=True)
        seconds["flop_counter_backward"] = time.perf_counter() - start
    return CrossCheck(cfg, batch, seq, device, parameter_breakdown(cfg), live, live_per_layer, fwd, results, bwd, seconds)
