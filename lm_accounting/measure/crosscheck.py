"""Analytic vs live: parameters from the module, FLOPs from fvcore and FlopCounterMode.

A cross-check passes only if every matmul component and every parameter component
agrees exactly, in total and layer by layer, and no counter finds matmul FLOPs
outside the known components.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..analytic.flops import forward_flops
from ..analytic.hardware_flops import step_flops
from ..analytic.params import parameter_breakdown
from ..analytic.sizes import at_context, check_batch_seq
from ..breakdown import Breakdown, Item
from ..config import AccountingError, ModelConfig
from ..names import COUNTERS, DEVICES
from ..result import Result
from ..setup import TrainingSetup
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


def compare(
    analytic: Breakdown,
    counted: dict[str, int],
    per_layer: dict[str, dict[int, int]],
    layers: int,
    what: str,
    cfg: ModelConfig | None = None,
) -> list[str]:
    """Every disagreement, as one readable line naming the component (and layer).  With ``cfg`` a
    component expected in some blocks only (a dense FFN or a mixture of experts, ``Component.layers``)
    must count 0 in the others."""
    from ..components import component

    problems = []
    for item in analytic:
        got = counted.get(item.key, 0)
        if got != item.total:
            problems.append(f"{what}: {item.key}: analytic {item.total:,} != counted {got:,}")
        if item.per_layer is not None and item.total:
            entry = component(item.key) if cfg is not None else None
            for layer in range(layers):
                value = per_layer.get(item.key, {}).get(layer, 0)
                expected = item.per_layer if entry is None or entry.in_layer(cfg, layer) else 0
                if value != expected:
                    name = item.key.replace("*", str(layer))
                    problems.append(f"{what}: {name}: analytic {expected:,} != counted {value:,}")
                    break
    for key in counted.keys() - set(analytic.totals()):
        if counted[key]:
            problems.append(f"{what}: {key}: counted {counted[key]:,} but the analytic model has no such component")
    return problems


@dataclass(frozen=True)
class CrossCheck(Result):
    """Analytic vs the live model: parameters from ``named_parameters()``, FLOPs from each counter."""

    SCHEMA = "lm-accounting/crosscheck/4"

    config: ModelConfig
    batch: int
    seq: int
    device: str
    params: Breakdown
    live_params: dict[str, int]
    live_params_per_layer: dict[str, dict[int, int]]
    forward: Breakdown
    counters: list[CounterResult]
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    backward: CounterResult | None = None

    @property
    def expected_backward(self) -> int:
        """Backward matmul FLOPs the step really runs: 2 × forward, plus the setup's recompute
        (``analytic.hardware_flops``: full checkpointing, the fused-attention backward)."""
        return step_flops(self.config, self.seq, self.batch, self.setup).hardware - self.forward.total

    def mismatches(self) -> list[str]:
        L = self.config.num_layers
        cfg = self.config
        out = compare(self.params, self.live_params, self.live_params_per_layer, L, "parameters", cfg)
        keys = list(self.forward.totals())
        for c in self.counters:
            out += compare(self.forward, c.by_key, c.per_layer, L, c.counter, cfg)
            if c.unattributed(keys):
                out.append(f"{c.counter}: {c.unattributed(keys):,} FLOPs counted outside the known components")
        if self.backward is not None:
            bwd = self.backward.total - self.flop_counter.total
            if bwd != self.expected_backward:
                out.append(f"backward: FlopCounterMode {bwd:,} != analytic {self.expected_backward:,}")
        return out

    @property
    def flop_counter(self) -> CounterResult:
        return next(c for c in self.counters if c.counter == "FlopCounterMode")

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows, one per (quantity, component, source): section, key, source, value, analytic, agrees."""
        rows = []
        for it in self.forward:
            for c in self.counters:
                value = c.by_key.get(it.key, 0)
                rows.append(
                    dict(
                        section="forward_flops",
                        key=it.key,
                        source=c.counter,
                        value=value,
                        analytic=it.total,
                        agrees=value == it.total,
                    )
                )
        for it in self.params:
            value = self.live_params.get(it.key, 0)
            rows.append(
                dict(
                    section="parameters",
                    key=it.key,
                    source="named_parameters",
                    value=value,
                    analytic=it.total,
                    agrees=value == it.total,
                )
            )
        if self.backward is not None:
            value = self.backward.total - self.flop_counter.total
            rows.append(
                dict(
                    section="backward_flops",
                    key="total",
                    source=self.backward.counter,
                    value=value,
                    analytic=self.expected_backward,
                    agrees=value == self.expected_backward,
                )
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "config": self.config.resolved(),
            "batch": self.batch,
            "context": self.seq,
            "device": self.device,
            "setup": self.setup.to_dict(),
            "parameters": [
                {"key": it.key, "analytic": it.total, "live": self.live_params.get(it.key, 0)} for it in self.params
            ],
            "forward_flops": [
                {"key": it.key, "analytic": it.total, **{c.counter: c.by_key.get(it.key, 0) for c in self.counters}}
                for it in self.forward
            ],
            "totals": {"analytic": self.forward.total, **{c.counter: c.total for c in self.counters}},
            "parameter_totals": {"analytic": self.params.total, "live": sum(self.live_params.values())},
            "backward": None
            if self.backward is None
            else {
                "analytic": self.expected_backward,
                "flop_counter": self.backward.total - self.flop_counter.total,
            },
            "skipped_ops": {c.counter: c.skipped_ops for c in self.counters},
            "mismatches": self.mismatches(),
        }


def fused_attention_view(fwd: Breakdown) -> Breakdown:
    """The forward breakdown as a fused-attention model's modules show it: QKᵀ and AV are one
    ``layers.*.attn.sdpa`` kernel (4·B·h·S²·d_head, the same FLOPs), so they compare as one."""
    qk, av = fwd["layers.*.attn.qk"], fwd["layers.*.attn.av"]
    fused = Item(
        "layers.*.attn.sdpa",
        "fused attention QKᵀ + AV",
        qk.group,
        qk.total + av.total,
        qk.per_layer + av.per_layer,
        "L·(4·B·h·S²·d_head)",
    )
    items = [fused if it is qk else it for it in fwd if it is not av]
    return Breakdown(fwd.quantity, fwd.unit, tuple(items))


def crosscheck(
    cfg: ModelConfig,
    seq: int | None = None,
    batch: int = 1,
    device: str = "meta",
    backward: bool = False,
    counters: tuple[str, ...] = COUNTERS,
    setup: TrainingSetup | None = None,
) -> CrossCheck:
    """Build the live model for ``cfg`` at ``seq`` tokens on ``device`` and count it with ``counters``.

    ``counters`` names any of ``names.COUNTERS`` ("fvcore", "flop_counter"); ``backward`` adds a
    forward + backward FlopCounterMode pass, compared with the step's hardware FLOPs under
    ``setup`` (recompute included).  The run is refused (``AccountingError``) before
    anything is built if it cannot exist or fit (``measure.devices.check_live_run``)."""
    run = at_context(cfg, seq)
    seq = run.context_length
    check_batch_seq(batch, seq)
    if device not in DEVICES:
        raise AccountingError(f"unknown device '{device}' (valid: {', '.join(DEVICES)})")
    unknown = [name for name in counters if name not in COUNTERS]
    if unknown or not counters:
        raise AccountingError(f"unknown counter '{unknown[0] if unknown else ''}' (valid: {', '.join(COUNTERS)})")
    from .devices import check_live_run

    check_live_run(run, seq, batch, device, "this cross-check", backward=backward)
    import torch

    from ..model import build_model, random_tokens

    if backward and "flop_counter" not in counters:
        counters = (*counters, "flop_counter")
    if device == "cpu":
        torch.manual_seed(0)
    setup = setup or TrainingSetup()
    model = build_model(run, device=device, setup=setup)
    tokens = random_tokens(run, batch, seq, device=device)
    live, live_per_layer = live_parameter_counts(model)
    fwd = forward_flops(run, seq, batch)
    if setup.attention == "sdpa":
        fwd = fused_attention_view(fwd)
    keys = list(fwd.totals())
    count = {"fvcore": count_fvcore, "flop_counter": count_flop_counter}
    results = [count[name](model, tokens, keys) for name in counters]
    bwd = count_flop_counter(model, tokens, keys, backward=True) if backward else None
    return CrossCheck(run, batch, seq, device, parameter_breakdown(run), live, live_per_layer, fwd, results, setup, bwd)
