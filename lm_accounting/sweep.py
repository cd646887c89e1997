"""Context-length sweeps and model-size comparisons: one row per (model, context).

The rows are built only from the analytic calculator, the exact memory replay and (when
asked) the live cross-check and memory measurement, so every number in a sweep is the
same number the other commands print.  ``Sweep.to_frame()`` gives a pandas DataFrame.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .account import account
from .analytic.activations import saved_activation_breakdown
from .analytic.capacity import max_context_that_fits
from .analytic.memory import adamw_step_temporary_bytes, model_state_breakdown
from .analytic.replay import predict_training_step
from .config import AccountingError, ModelConfig

GROUPS = ("attention projections", "attention matmuls", "ffn", "lm head")
MAX_POINTS = 10_000  # a sweep is a table and a plot, not a scan


def parse_contexts(text: str) -> list[int]:
    """'128,256,1024' or '128:16384:x2' (geometric) or '256:2048:+256' (arithmetic)."""
    text = text.strip()
    match = re.fullmatch(r"(\d+):(\d+):([x+])(\d+)", text)
    usage = (f"--contexts '{text}' must be positive integers like 128,256,512 or a range like "
             "128:16384:x2 (doubling) or 256:2048:+256")
    if match:
        start, stop, op, step = int(match[1]), int(match[2]), match[3], int(match[4])
        if start < 1 or stop < start or step < (2 if op == "x" else 1):
            raise AccountingError(usage)
        out, value = [], start
        while value <= stop:
            out.append(value)
            value = value * step if op == "x" else value + step
            if len(out) > MAX_POINTS:
                raise AccountingError(f"--contexts '{text}' gives more than {MAX_POINTS:,} contexts")
        return out
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise AccountingError(usage) from None
    if not values or min(values) < 1:
        raise AccountingError(usage)
    return sorted(set(values))


def analytic_row(cfg: ModelConfig, seq: int, batch: int, dtype: str, optimizer: str, budget: int,
                 max_context: int) -> dict[str, Any]:
    """Every analytic column of one (model, context) row."""
    cfg = cfg.with_context(seq)
    acc = account(cfg, seq, batch)
    groups = acc.forward.groups()
    total = acc.forward.total
    states = model_state_breakdown(cfg, dtype)
    step = predict_training_step(cfg, seq, batch, dtype, optimizer)
    row: dict[str, Any] = {"model": cfg.name, "context": seq, "batch": batch, "params": acc.params.total}
    row.update({f"flops:{k}": v for k, v in acc.forward.totals().items()})
    row["flops:total"] = total
    row.update({f"group:{g}": groups.get(g, 0) for g in GROUPS})
    row.update({f"share:{g}": groups.get(g, 0) / total for g in GROUPS})
    row["flops:quadratic"] = groups["attention matmuls"]
    row["flops:linear"] = total - groups["attention matmuls"]
    row["flops:nonmatmul"] = acc.nonmatmul.total
    row["flops:train_step"] = acc.training.step
    row["mem:parameters"] = states["parameters"].total
    row["mem:gradients"] = states["gradients"].total
    row["mem:optimizer"] = states["adamw.exp_avg"].total + states["adamw.exp_avg_sq"].total
    row["mem:activations"] = saved_activation_breakdown(cfg, seq, batch, dtype).total
    row["mem:step_temporaries"] = adamw_step_temporary_bytes(cfg, dtype, optimizer)
    row["mem:peak"] = step.peak
    row.update({f"mem:peak.{name}": p.peak for name, p in step.phases().items()})
    row["mem:kv_cache"] = acc.kv_cache_bytes()["bf16" if dtype != "fp32" else "fp32"]
    row["mem:budget"] = budget
    row["mem:max_context"] = max_context  # largest context whose step fits the budget (exact)
    row["measured:flops"] = None
    row["measured:peak"] = None
    row["measured:device"] = None
    return row


@dataclass
class Sweep:
    batch: int
    dtype: str
    optimizer: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def to_frame(self):
        """One row per (model, context); columns as in ``analytic_row`` (pandas imported here)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "lm-accounting/sweep/1", "batch": self.batch, "dtype": self.dtype,
                "optimizer": self.optimizer, "rows": self.rows, "mismatches": self.mismatches}


def sweep(configs: Sequence[ModelConfig], contexts: Iterable[int], batch: int = 1, *, dtype: str = "fp32",
          optimizer: str = "foreach", budget: int = 80 * 10**9, crosscheck: bool = False,
          measure: str | None = None, progress: bool = False) -> Sweep:
    """Analytic rows for every (config, context) (``budget`` sets ``mem:max_context``); with ``crosscheck`` the live model's
    FlopCounterMode and fvcore totals are checked against them, and with ``measure``
    ('meta', 'cpu' or 'cuda') one training step is measured at each point."""
    result = Sweep(batch, dtype, optimizer)
    names = [cfg.name for cfg in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AccountingError(f"two models are named '{twice[0]}'; give each TOML file a distinct 'name'")
    contexts = list(contexts)
    if len(configs) * len(contexts) > MAX_POINTS:
        raise AccountingError(f"{len(configs) * len(contexts):,} sweep points is more than {MAX_POINTS:,}; "
                              "use fewer --contexts (e.g. 128:16384:x2)")
    points = [(cfg, seq) for cfg in configs for seq in contexts]
    if measure:
        from .measure.devices import available_bytes

        available_bytes(measure)  # fails early, before any work, if the device is missing
    live = crosscheck or measure
    bar = None
    if live and progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), unit="point", desc="sweep (live models)", leave=False)
    fitting = {cfg.name: max_context_that_fits(cfg, budget, batch, dtype, optimizer) for cfg in configs}
    for cfg, seq in points:
        row = analytic_row(cfg, seq, batch, dtype, optimizer, budget, fitting[cfg.name])
        if crosscheck:
            from .measure.crosscheck import crosscheck as run_crosscheck

            cc = run_crosscheck(cfg.with_context(seq), seq, batch)
            row["measured:flops"] = cc.flop_counter.total
            result.mismatches += [f"{cfg.name} @ {seq}: {m}" for m in cc.mismatches()]
        if measure:
            from .measure.devices import check_device_fits
            from .measure.memory import measure_step

            check_device_fits(measure, row["mem:peak"], f"the training step of {cfg.name} at context {seq:,}")
            measured = measure_step(cfg.with_context(seq), seq, batch, dtype, measure, optimizer)
            row["measured:peak"] = measured.peak
            row["measured:device"] = measure
        result.rows.append(row)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return result
