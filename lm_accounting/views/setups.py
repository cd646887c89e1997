"""Peak training memory against context for the training setups engineers use, and the largest
context that fits a budget: a table and a figure (``reports/setups/``).

Every figure is the exact replay's prediction of the plain run on a CUDA GPU
(``analytic.replay.predict_training_step(..., device="cuda")``: CUDA's flash kernel, no allocator
rounding, no cuBLAS workspaces), for one sequence per step with foreach AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..analytic.replay import predict_training_step
from ..config import ModelConfig
from ..setup import TrainingSetup
from .tables import Column, Table

COMPARED = (  # label -> setup: the four setups of the comparison, all amp-bf16 except the course's naive
    ("naive attention", TrainingSetup(attention="naive", precision="amp-bf16")),
    ("sdpa", TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ("sdpa + full checkpointing", TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")),
    ("sdpa + selective checkpointing", TrainingSetup(attention="sdpa", checkpoint="selective", precision="amp-bf16")),
)
MAX_CONTEXT = 1 << 24  # 16M tokens: the search bound for the largest fitting context


@dataclass(frozen=True)
class SetupRow:
    model: str
    setup: str
    context: int
    peak: int  # bytes, plain run
    max_context: int  # largest context whose step fits the budget (0: none)


def peak_bytes(cfg: ModelConfig, seq: int, setup: TrainingSetup) -> int:
    """The plain-run step peak on a CUDA GPU of ``cfg`` rebuilt for ``seq`` tokens (its RoPE tables grow
    with it)."""
    return predict_training_step(cfg.with_context(seq), seq, 1, setup=setup, device="cuda", mode="plain").peak


def largest_context(cfg: ModelConfig, setup: TrainingSetup, budget: int) -> int:
    """Largest context whose plain-run step peak fits ``budget`` (memory grows with the context)."""
    if peak_bytes(cfg, 1, setup) > budget:
        return 0
    low, high = 1, 2
    while high <= MAX_CONTEXT and peak_bytes(cfg, high, setup) <= budget:
        low, high = high, high * 2
    high = min(high, MAX_CONTEXT + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if peak_bytes(cfg, mid, setup) <= budget else (low, mid)
    return low


def setup_rows(configs: list[ModelConfig], contexts: list[int], budget: int) -> list[SetupRow]:
    rows = []
    for cfg in configs:
        for label, setup in COMPARED:
            fit = largest_context(cfg, setup, budget)
            rows += [SetupRow(cfg.name, label, s, peak_bytes(cfg, s, setup), fit) for s in contexts]
    return rows


def setup_table(rows: list[SetupRow], budget_label: str) -> Table:
    models = list(dict.fromkeys(r.model for r in rows))
    contexts = sorted({r.context for r in rows})
    columns = [
        Column("model"),
        Column("setup"),
        *[Column(f"S = {s:,}", "bytes") for s in contexts],
        Column(f"largest context in {budget_label}", "int"),
    ]
    body = []
    for model in models:
        for label, _ in COMPARED:
            mine = {r.context: r for r in rows if r.model == model and r.setup == label}
            first = next(iter(mine.values()))
            body.append((model, label, *[mine[s].peak for s in contexts], first.max_context))
    return Table(
        "Peak memory of one training step (batch 1, amp-bf16 unless naive, foreach AdamW), plain run on a CUDA GPU",
        columns,
        body,
        [
            (
                "amp-bf16: fp32 weights, gradients and AdamW state, bf16 autocast compute; 'naive' keeps the S×S "
                "scores; sdpa is CUDA's flash kernel; the prediction is exact for our live model (the caching allocator's "
                "rounding and the cuBLAS workspaces, tens of MB, come on top)"
            )
        ],
    )


def plot_setups(rows: list[SetupRow], path_stem: Path, budget: int, budget_label: str) -> list[Path]:
    """One panel per model: peak bytes vs context for each setup, the budget line, and a star at
    each setup's largest fitting context."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullLocator

    from .plots import _fmt_tokens, _save

    models = list(dict.fromkeys(r.model for r in rows))
    fig = Figure(figsize=(6.2 * len(models), 4.8), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    colors = ("#C44E52", "#4C72B0", "#55A868", "#8172B3")
    for ax, model in zip(axes, models, strict=True):
        for (label, _), color in zip(COMPARED, colors, strict=True):
            mine = [r for r in rows if r.model == model and r.setup == label]
            fit = mine[0].max_context
            verdict = f"fits up to {fit:,} tokens" if fit else f"does not fit {budget_label} at any context"
            ax.plot(
                [r.context for r in mine],
                [r.peak / 1e9 for r in mine],
                marker="o",
                ms=3,
                color=color,
                label=f"{label}: {verdict}",
            )
            if fit:
                ax.plot([fit], [budget / 1e9], marker="*", ms=13, color=color, mec="black", mew=0.6, zorder=5)
        ax.axhline(budget / 1e9, color="black", lw=1, ls="--", label=f"budget {budget_label}")
        contexts = sorted({r.context for r in rows})
        ax.set(
            xscale="log",
            yscale="log",
            title=model,
            xlabel="context (tokens; 1k = 1,024)",
            ylabel="peak memory of a training step (GB = 10⁹ bytes)",
        )
        ax.set_xticks(contexts, [_fmt_tokens(s) for s in contexts])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _=None: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Training-step peak vs context by setup (batch 1; ★ = largest context that fits)", fontsize=11)
    return _save(fig, path_stem, return_fig=False)
