"""Context-length sweeps and model-size comparisons: one row per (model, context).

The rows are built only from the analytic calculator, the exact memory replay and (when
asked) the live cross-check and memory measurement, so every number in a sweep is the
same number the other commands print.  ``Sweep.to_frame()`` gives a pandas DataFrame.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .account import account
from .analytic.activations import saved_activation_breakdown
from .analytic.hardware_flops import step_flops
from .analytic.memory import adamw_step_temporary_bytes, model_state_breakdown
from .config import AccountingError, ModelConfig, check_positive_int
from .implementations import check_impl, check_measurable
from .phases import PHASES
from .result import Result
from .setup import TrainingSetup, check_cuda_fused_attention

GROUPS = ("attention projections", "attention matmuls", "ffn", "lm head")
MAX_POINTS = 1_000
"""A sweep is a table and a plot, not a scan.  The old cap of 10,000 points ran over 10 minutes
(analytic rows ~4 ms each, then SVG figures of ~10 MB each); 2,000 points of gpt2-small took
117 s and 0.24 GB RSS (`lm-account sweep gpt2-small --contexts 1:2000:+1`, 2-core machine), so
1,000 points stay near one minute."""
MAX_MODELS = 16
"""At most this many models in one sweep: each gets its own memory figure (about 2 s each)."""


def parse_contexts(text: str) -> list[int]:
    """'128,256,1024' or '128:16384:x2' (geometric) or '256:2048:+256' (arithmetic).

    Every context is checked like any other count (1 to 10^18); a number of any length is refused
    without converting it (and echoed shortened), and a sweep has at most ``MAX_POINTS`` contexts."""
    if not isinstance(text, str):
        raise AccountingError(f"--contexts must be a string such as '128:16384:x2', got {type(text).__name__}")
    text = text.strip()
    shown = text if len(text) <= 60 else text[:59] + f"…({len(text):,} characters)"
    usage = (
        f"--contexts '{shown}' must be positive integers like 128,256,512 or a range like "
        "128:16384:x2 (doubling) or 256:2048:+256"
    )
    long = re.search(r"[0-9_]{31,}", text)
    if long:
        digits = long[0].replace("_", "").lstrip("0")
        raise AccountingError(f"--contexts: {digits[:4]}…({len(digits):,} digits) is beyond the supported 10^18")
    match = re.fullmatch(r"(\d+):(\d+):([x+])(\d+)", text)
    if match:
        start, stop, op, step = int(match[1]), int(match[2]), match[3], int(match[4])
        if start < 1 or stop < start or step < (2 if op == "x" else 1):
            raise AccountingError(usage)
        check_positive_int("--contexts: the last context", stop)
        out, value = [], start
        while value <= stop:
            out.append(value)
            value = value * step if op == "x" else value + step
            if len(out) > MAX_POINTS:
                raise AccountingError(f"--contexts '{shown}' gives more than {MAX_POINTS:,} contexts")
        return out
    parts = text.split(",")
    if len(parts) > MAX_POINTS:
        raise AccountingError(f"--contexts '{shown}' gives more than {MAX_POINTS:,} contexts")
    try:
        values = [int(v) for v in parts]
    except ValueError:
        raise AccountingError(usage) from None
    if not values or min(values) < 1:
        raise AccountingError(usage)
    for value in values:
        check_positive_int("--contexts: a context", value)
    return sorted(set(values))


def analytic_row(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    dtype: str | None,
    optimizer: str | None,
    budget: int,
    max_context: int | None,
    *,
    setup: TrainingSetup | None = None,
    device: str = "cuda",
    impl: str = "course",
) -> dict[str, Any]:
    """Every analytic column of one (model, context) row under ``setup`` (or, as before, pure ``dtype``
    with AdamW ``optimizer``).  The memory columns are the ``memory`` command's: model states in the
    parameters' dtype, the activations saved for backward under the setup, and the step peak of the
    *plain* run on ``device`` (``mem:peak``, as ``memory_account(..., device=device).step``: cuda, or
    meta where the sweep measures on meta or cpu); ``mem:peak_traced`` is what the storage tracker sees
    on meta (``replay.traced_minus_plain`` gives the gap).  ``flops:model_step`` is 3 × forward,
    ``flops:hardware_step`` adds the checkpoint and fused-attention recompute (``hardware_flops.step_flops``).
    ``impl``: the model code whose steps the memory columns are (``program_report.predicted_steps``); the
    saved-activation column is the replay's only (None for a step of the op library)."""
    from .analytic.program_report import predicted_steps, replayed  # the step replay: loaded by a sweep, not
    from .analytic.replay import as_setup  # by ``import lm_accounting`` (reading a config.json stays light)

    setup, dtype = as_setup(setup, dtype, optimizer, default_optimizer="foreach")
    optimizer = setup.optimizer
    cfg = cfg.with_context(seq)
    acc = account(cfg, seq, batch)
    groups = acc.forward.groups()
    total = acc.forward.total
    states = model_state_breakdown(cfg, dtype)
    steps = predicted_steps(cfg, seq, batch, impl=impl, setup=setup, device=device)  # None: as the memory command
    step, traced = steps or (None, None)
    flops = step_flops(cfg, seq, batch, setup)
    row: dict[str, Any] = {"model": cfg.name, "context": seq, "batch": batch, "params": acc.params.total}
    row["setup"] = setup.label
    row["impl"] = impl
    row.update({f"flops:{k}": v for k, v in acc.forward.totals().items()})
    row["flops:total"] = total
    row.update({f"group:{g}": groups.get(g, 0) for g in GROUPS})
    row.update({f"share:{g}": groups.get(g, 0) / total for g in GROUPS})
    row["flops:quadratic"] = acc.attention_matmuls
    row["flops:linear"] = total - acc.attention_matmuls
    row["flops:nonmatmul"] = acc.nonmatmul.total
    row["flops:train_step"] = acc.training.step
    row["flops:model_step"] = flops.model
    row["flops:hardware_step"] = flops.hardware
    row["mem:parameters"] = states["parameters"].total
    row["mem:gradients"] = states["gradients"].total
    row["mem:optimizer"] = states["adamw.exp_avg"].total + states["adamw.exp_avg_sq"].total
    row["mem:activations"] = (
        saved_activation_breakdown(cfg, seq, batch, setup=setup, device=device).total
        if replayed(cfg, setup, impl)
        else None
    )
    row["mem:step_temporaries"] = adamw_step_temporary_bytes(cfg, dtype, optimizer, implementation=impl)
    row["mem:peak"] = step.peak if steps else None
    row.update({f"mem:peak.{name}": step.phase(name).peak if steps else None for name in PHASES})
    row["mem:peak_traced"] = traced.peak if steps else None
    row["mem:kv_cache"] = acc.kv_cache_bytes()["bf16" if dtype != "fp32" else "fp32"]
    row["mem:budget"] = budget
    row["mem:max_context"] = max_context  # largest context whose plain step fits the budget (exact)
    row["measured:flops"] = None
    row["measured:peak"] = None
    row["measured:device"] = None
    row["measured:run"] = None  # "traced" (the storage tracker: compare mem:peak_traced) or "plain" (cuda)
    return row


POINT = ("model", "context", "batch", "setup")
"""The columns of ``analytic_row`` that name a sweep point; every other column is one fact about it."""
UNITS = {"params": "params", "mem:max_context": "tokens", "measured:peak": "bytes", "measured:flops": "FLOPs"}
UNITS |= {"measured:device": "", "measured:run": "", "impl": ""}
PREFIX_UNITS = {"flops": "FLOPs", "group": "FLOPs", "share": "share", "mem": "bytes"}


def unit_of(column: str) -> str:
    """The unit of an ``analytic_row`` column: 'FLOPs', 'bytes', 'share', 'tokens', 'params' or '' (a label)."""
    return UNITS[column] if column in UNITS else PREFIX_UNITS[column.split(":", 1)[0]]


@dataclass
class Sweep(Result):
    """One row per (model, context): ``to_dict()`` (JSON, the rows), ``records()`` (tidy: CSV), ``to_frame()``
    (the rows, wide, for plotting)."""

    SCHEMA: ClassVar[str] = "lm-accounting/sweep/3"

    batch: int
    dtype: str  # the parameters' dtype (fp32 under amp-bf16)
    optimizer: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    skipped: list[str] = field(default_factory=list)  # contexts a model cannot run (``runnable_points``)

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows, one fact each, the same keys on every row: model, context, batch, setup (the point),
        quantity (an ``analytic_row`` column), value (empty: not measured or not modelled), unit."""
        out = []
        for row in self.rows:
            point = {k: row[k] for k in POINT}
            for key, value in row.items():
                if key not in POINT:
                    out.append({**point, "quantity": key, "value": value, "unit": unit_of(key)})
        return out

    def to_frame(self):
        """One row per (model, context); columns as in ``analytic_row`` (pandas imported here).
        Numeric columns keep pandas' numeric dtypes, for plotting."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "batch": self.batch,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "setup": {**self.setup.to_dict(), "label": self.setup.label},
            "rows": self.rows,
            "mismatches": self.mismatches,
        }


def runnable_points(
    configs: Sequence[ModelConfig], contexts: list[int]
) -> tuple[list[tuple[ModelConfig, int]], list[str]]:
    """The (model, context) points a sweep runs: a model with a learned position table of a given size (GPT-2's
    1,024) runs no longer context, so those contexts are left out for it, one sentence per model; a model left
    with none is refused (``ModelConfig``'s own error)."""
    from .analytic.capacity import context_limit  # with the step replay (``analytic_row``)

    points, skipped = [], []
    for cfg in configs:
        limit = context_limit(cfg)
        over = [seq for seq in contexts if limit is not None and seq > limit]
        if over and len(over) == len(contexts):
            cfg.with_context(over[0])  # raises: the context exceeds the position table
        if over:
            shown = ", ".join(f"{seq:,}" for seq in over)
            skipped.append(f"{cfg.name} at {shown} tokens: beyond its {limit:,} learned positions")
        points += [(cfg, seq) for seq in contexts if seq not in over]
    return points, skipped


def sweep(
    configs: Sequence[ModelConfig],
    contexts: Iterable[int],
    batch: int = 1,
    *,
    dtype: str | None = None,
    optimizer: str | None = None,
    setup: TrainingSetup | None = None,
    budget: int = 80 * 10**9,
    crosscheck: bool = False,
    measure: str | None = None,
    progress: bool = False,
    allow_long: bool = False,
    impls: Sequence[str] | None = None,
) -> Sweep:
    """Analytic rows for every (config, context) under ``setup`` (or, as before, pure ``dtype``, default
    fp32, with AdamW ``optimizer``, default foreach; ``budget`` sets ``mem:max_context``); with
    ``crosscheck`` the live model's FlopCounterMode and fvcore totals are checked against them, and with
    ``measure`` ('meta', 'cpu' or 'cuda') one training step is measured at each point under the same setup
    (the storage tracker on meta/cpu: the traced run, ``mem:peak_traced``; cuda: the plain run, ``mem:peak``).

    Before any live work every point is checked (``measure.devices.check_live_run``: tensors that
    cannot exist, deep models, memory, a missing GPU) and the live run time is estimated
    (``estimate_live_seconds``); above ``MAX_LIVE_SECONDS`` the sweep is refused unless ``allow_long``.
    ``impls``: each config's implementation (``implementations``; default: course for all)."""
    from .names import ADAMW_KWARGS, DEVICES, TRAINING_DTYPES

    if isinstance(configs, ModelConfig) or not isinstance(configs, Sequence) or not configs:
        raise AccountingError("sweep expects a non-empty list of ModelConfig")
    for cfg in configs:
        if not isinstance(cfg, ModelConfig):
            raise AccountingError(f"sweep expects ModelConfig items, got {type(cfg).__name__}")
    if len(configs) > MAX_MODELS:
        raise AccountingError(
            f"{len(configs):,} models is more than {MAX_MODELS} in one sweep (one memory "
            "figure each); split them into several sweeps"
        )
    check_positive_int("batch", batch)
    check_positive_int("budget", budget, limit=None)
    if dtype is not None and dtype not in TRAINING_DTYPES:
        raise AccountingError(f"unknown dtype {dtype!r:.40} (choose from {', '.join(TRAINING_DTYPES)})")
    if optimizer is not None and optimizer not in ADAMW_KWARGS:
        raise AccountingError(f"unknown optimizer {optimizer!r:.40} (choose from {', '.join(ADAMW_KWARGS)})")
    if setup is not None and not isinstance(setup, TrainingSetup):
        raise AccountingError(f"setup must be a TrainingSetup, got {type(setup).__name__}")
    from .analytic.program_report import largest_context  # with the step replay (``analytic_row``)
    from .analytic.replay import as_setup

    setup, dtype = as_setup(setup, dtype, optimizer, default_optimizer="foreach")
    optimizer = setup.optimizer
    if measure is not None and measure not in DEVICES:
        raise AccountingError(f"unknown measure device {measure!r:.40} (choose from {', '.join(DEVICES)})")
    device = "meta" if measure in ("meta", "cpu") else "cuda"  # the plain run predicted, as the memory command's
    impls = tuple(impls or ("course",) * len(configs))
    if len(impls) != len(configs):
        raise AccountingError(f"sweep got {len(impls)} implementations for {len(configs)} models")
    for cfg, impl in zip(configs, impls, strict=True):
        check_impl(cfg, impl)
        check_measurable(impl, measure or "none")
        if device == "cuda" and setup.attention == "sdpa" and impl == "course":  # CUDA's kernels, our model
            check_cuda_fused_attention(cfg.kv_heads < cfg.num_heads, setup.precision == "fp32")
    result = Sweep(batch, dtype, optimizer, setup=setup)
    names = [cfg.name for cfg in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AccountingError(f"two models are named '{twice[0]}'; give each TOML file a distinct 'name'")
    if isinstance(contexts, (str, bytes)):
        raise AccountingError("contexts must be a list of integers (parse a string with parse_contexts)")
    seen: list[int] = []
    for seq in contexts:
        check_positive_int("context", seq)
        seen.append(seq)
        if len(seen) * len(configs) > MAX_POINTS:
            raise AccountingError(
                f"more than {MAX_POINTS:,} sweep points; use fewer contexts (e.g. 128:16384:x2) or fewer models"
            )
    contexts = seen
    if not contexts:
        raise AccountingError("sweep needs at least one context")
    points, result.skipped = runnable_points(configs, contexts)
    impl_of = {cfg.name: impl for cfg, impl in zip(configs, impls, strict=True)}  # names are distinct
    live = bool(crosscheck or measure)
    if live:
        check_live_points(points, batch, dtype, optimizer, crosscheck, measure, allow_long, setup, impl_of)
    bar = None
    if live and progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), unit="point", desc="sweep (live models)", leave=False)
    fitting = {
        cfg.name: largest_context(cfg, budget, batch, impl=impl_of[cfg.name], setup=setup, device=device)
        for cfg in configs
    }
    for cfg, seq in points:
        impl = impl_of[cfg.name]
        row = analytic_row(
            cfg, seq, batch, None, None, budget, fitting[cfg.name], setup=setup, device=device, impl=impl
        )  # fmt: skip
        if crosscheck:
            from .measure.crosscheck import crosscheck as run_crosscheck

            cc = run_crosscheck(cfg.with_context(seq), seq, batch, setup=setup)
            row["measured:flops"] = cc.flop_counter.total
            result.mismatches += [f"{cfg.name} @ {seq}: {m}" for m in cc.mismatches()]
        if measure:
            measured = measure_point(cfg.with_context(seq), seq, batch, setup, measure, impl)
            row["measured:peak"] = measured.peak
            row["measured:device"] = measure
            row["measured:run"] = "plain" if measure == "cuda" else "traced"
            want = row["mem:peak_traced"]
            if measure == "meta" and want is not None and measured.peak != want:  # the prediction's own device
                result.mismatches.append(f"{cfg.name} @ {seq}: measured peak {measured.peak:,} != predicted {want:,}")
        result.rows.append(row)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return result


def measure_point(cfg: ModelConfig, seq: int, batch: int, setup, device: str, impl: str):
    """One training step's ``StepMemory`` measured on ``device``: transformers' own model class
    (``measure.hf.measure_hf_step``) for ``impl`` transformers, else our live model (``measure_step``)."""
    if impl == "transformers":
        from .measure.hf import measure_hf_step

        return measure_hf_step(cfg, seq, batch, setup, device=device)
    from .measure.memory import measure_step

    return measure_step(cfg, seq, batch, device=device, setup=setup)


def check_live_points(
    points: Sequence[tuple[ModelConfig, int]],
    batch: int,
    dtype: str,
    optimizer: str,
    crosscheck: bool,
    measure: str | None,
    allow_long: bool,
    setup: TrainingSetup | None = None,
    impl_of: dict[str, str] | None = None,
) -> float:
    """Check every live point before any is run; return the estimated seconds of the live work.

    Each point goes through ``check_live_run`` (the cross-check runs on meta; a measured step on
    ``measure``).  The estimate is the sum of ``estimate_live_seconds``; above ``MAX_LIVE_SECONDS``
    without ``allow_long`` the sweep is refused, with the estimate in the message."""
    from .analytic.program_report import step_unmodelled  # with the step replay (``analytic_row``)
    from .measure.devices import MAX_LIVE_SECONDS, check_live_run, estimate_live_seconds, fmt_seconds

    total = 0.0
    for cfg, seq in points:
        at = cfg.with_context(seq)
        where = f"{cfg.name} at context {seq:,}"
        if crosscheck:
            check_live_run(at, seq, batch, "meta", f"the cross-check of {where}", allow_long=True)  # the sum, below
            total += estimate_live_seconds(at, seq, batch, "meta", counting=True)
        if measure:
            impl = (impl_of or {}).get(cfg.name, "course")
            missing = step_unmodelled(at, setup or TrainingSetup(), impl)  # any MoE split is replayed at one batch
            if missing:  # as the memory command: a measurement needs a prediction to compare with
                who = "the step replay" if impl == "course" else f"the {impl} program"
                raise AccountingError(
                    f"--measure-memory needs {who}, which does not model {', '.join(missing)} "
                    f"({cfg.name}) yet; leave it out for the analytic columns"
                )
            check_live_run(
                at,
                seq,
                batch,
                measure,
                f"the training step of {where}",
                training=True,
                dtype=dtype,
                optimizer=optimizer,
                allow_long=True,  # the sweep bounds the sum of its points' estimates, below
            )
            total += estimate_live_seconds(at, seq, batch, measure, training=True)
    if total > MAX_LIVE_SECONDS and not allow_long:
        raise AccountingError(
            f"this sweep's {len(points):,} live point{'' if len(points) == 1 else 's'} would take about "
            f"{fmt_seconds(total)} "
            f"(estimated; the limit without --allow-long is {fmt_seconds(MAX_LIVE_SECONDS)}); "
            "pass --allow-long (allow_long=True) to run it, or use fewer contexts or models"
        )
    return total
