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
from .words import fits_words, setup_from_label, setup_parts

COMPARED = (  # the four setups of the comparison: naive and sdpa attention, sdpa with each checkpointing
    TrainingSetup(attention="naive", precision="amp-bf16"),
    TrainingSetup(attention="sdpa", precision="amp-bf16"),
    TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16"),
    TrainingSetup(attention="sdpa", checkpoint="selective", precision="amp-bf16"),
)
MAX_CONTEXT = 1 << 24  # 16M tokens: the search bound for the largest fitting context
PRECISION_MEANING = {
    "fp32": "fp32 weights, activations, gradients and AdamW state",
    "bf16": "bf16 weights, activations, gradients and AdamW state (RMSNorm computes in fp32)",
    "amp-bf16": "fp32 weights, gradients and AdamW state, bf16 autocast compute",
}


@dataclass(frozen=True)
class SetupRow:
    model: str
    setup: str  # TrainingSetup.label: 'sdpa+full+amp-bf16+foreach'
    context: int
    peak: int  # bytes, plain run
    max_context: int  # largest context whose step fits the budget (0: none)


def split_words(setups) -> tuple[str, list[str]]:
    """The setups in words, split into what they share and what tells each apart:
    ('amp-bf16, AdamW foreach', ['naive attention, no checkpointing', 'sdpa attention, no checkpointing', …])."""
    parts = [setup_parts(s) for s in setups]
    same = [all(p[i] == parts[0][i] for p in parts) for i in range(len(parts[0]))]
    shared = ", ".join(w for w, keep in zip(parts[0], same, strict=True) if keep)
    return shared, [", ".join(w for w, keep in zip(p, same, strict=True) if not keep) for p in parts]


def _by_setup(rows: list[SetupRow]) -> tuple[str, dict[str, str]]:
    """What the rows' setups share in words, and each setup label's distinguishing words."""
    labels = list(dict.fromkeys(r.setup for r in rows))
    shared, apart = split_words([setup_from_label(label) for label in labels])
    return shared, dict(zip(labels, apart, strict=True))


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
        for setup in COMPARED:
            fit = largest_context(cfg, setup, budget)
            rows += [SetupRow(cfg.name, setup.label, s, peak_bytes(cfg, s, setup), fit) for s in contexts]
    return rows


def setup_table(rows: list[SetupRow], budget_label: str) -> Table:
    models = list(dict.fromkeys(r.model for r in rows))
    contexts = sorted({r.context for r in rows})
    shared, words = _by_setup(rows)
    columns = [
        Column("model"),
        Column("setup"),
        *[Column(f"S = {s:,}", "bytes") for s in contexts],
        Column(f"largest context in {budget_label} (tokens)"),
    ]
    body = []
    for model in models:
        for label, setup in words.items():
            mine = {r.context: r for r in rows if r.model == model and r.setup == label}
            first = next(iter(mine.values()))
            fit = f"{first.max_context:,}" if first.max_context else fits_words(first.max_context)
            body.append((model, setup, *[mine[s].peak for s in contexts], fit))
    precisions = dict.fromkeys(setup_from_label(label).precision for label in words)
    return Table(
        f"Peak memory of one training step (batch 1, {shared}), plain run on a CUDA GPU",
        columns,
        body,
        [
            "; ".join(f"{p}: {PRECISION_MEANING[p]}" for p in precisions)
            + (
                "; naive attention keeps the S×S scores; sdpa is CUDA's flash kernel; the prediction is exact for our "
                "live model (the caching allocator's rounding and the cuBLAS workspaces, tens of MB, come on top)"
            )
        ],
    )


def plot_setups(rows: list[SetupRow], path_stem: Path, budget: int, budget_label: str, *, return_fig: bool = False):
    """One panel per model: peak bytes vs context for each setup, the budget line, and a star at
    each setup's largest fitting context."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullLocator

    from .plots import fmt_tokens, save_figure

    models = list(dict.fromkeys(r.model for r in rows))
    shared, words = _by_setup(rows)
    fig = Figure(figsize=(6.2 * len(models), 4.8), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    colors = ("#C44E52", "#4C72B0", "#55A868", "#8172B3", "#937860", "#DA8BC3")
    for ax, model in zip(axes, models, strict=True):
        for i, (label, setup) in enumerate(words.items()):
            color = colors[i % len(colors)]
            mine = [r for r in rows if r.model == model and r.setup == label]
            fit = mine[0].max_context
            ax.plot(
                [r.context for r in mine],
                [r.peak / 1e9 for r in mine],
                marker="o",
                ms=3,
                color=color,
                label=f"{setup}: {fits_words(fit)}",
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
        ax.set_xticks(contexts, [fmt_tokens(s) for s in contexts])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _=None: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", title=f"largest context within {budget_label} (★)", title_fontsize=8)
    fig.suptitle(f"Training-step peak vs context by setup (batch 1, {shared}; plain run on a CUDA GPU)", fontsize=11)
    return save_figure(fig, path_stem, return_fig)
