"""The view of a ``Plan``: the best layouts, ranked by GPU-hours, the fastest at each GPU count (the frontier of
days against GPU-hours), and the assumptions behind them."""

from __future__ import annotations

from ..plan import Plan, context_parallel_words, frontier
from .account import describe_config
from .tables import Column, Table, View
from .words import plural


def plan_view(p: Plan) -> View:
    g = p.gpu
    header = [
        describe_config(p.config),
        (
            f"{g.label}: {g.memory_bytes / 1e9:,.0f} GB, {g.peak_flops('bf16') / 1e12:,.1f} TFLOP/s bf16 dense, "
            f"{g.interconnect} {g.interconnect_one_way / 1e9:,.0f} GB/s one way · inter-node "
            f"{p.internode_bw / 1e9:,.0f} GB/s per GPU (one NIC each; a data-parallel ring across nodes runs at "
            "its ranks per node × that, at most NVLink)"
        ),
        f"step time: {efficiency_words(p.calibration, p.efficiency)}",
        (
            f"context {p.seq:,} · global batch {plural(p.global_batch_tokens, 'token')} · {plural(p.tokens, 'token')} = "
            f"{plural(p.steps(), 'step')} · "
            + (
                f"{plural(p.evaluated, 'layout')} evaluated, {len(p.ranked):,} fit"
                if p.complete
                else f"{plural(p.evaluated, 'layout')} ranked by GPU-hours, the first {p.checked:,} checked against the GPU "
                f"to find the best {len(p.ranked):,} that fit (--top N for more)"
            )
        ),
        p.budget_basis.rule + ": a layout fits when its per-GPU peak + allowance is within the CUDA total",
    ]
    if p.own is not None:
        header.append(f"your own layout: {p.own}, priced alone (every checkpointing and micro-batch it leaves open)")
    columns = [
        Column("layout"),
        Column("GPUs", "int"),
        Column("ckpt"),
        Column("micro-batch", "int"),
        Column("accum", "int"),
        Column("per-GPU peak + allowance", "bytes"),
        Column("peak"),
        Column("step s", "float"),
        Column("MFU", "share"),
        Column("HFU", "share"),
        Column("tokens/s", "int"),
        Column("days", "float"),
        Column("GPU-hours", "int"),
    ]
    if p.price_per_gpu_hour is not None:
        columns.append(Column("cost", "int"))
    rows = [_row(p, c) for c in p.ranked]
    tables = [Table(f"Best {plural(len(rows), 'layout')} by GPU-hours (sdpa, amp-bf16, foreach AdamW)", columns, rows)]
    if p.fastest:
        on = frontier(p.fastest)
        fastest = [(*_row(p, c), "yes" if f else "no") for c, f in zip(p.fastest, on, strict=True)]
        tables.append(
            Table(
                "Fastest layout at each GPU count, from the cheapest's up (fewer GPUs: more days and at least its"
                " GPU-hours); on the frontier: no other takes fewer days and fewer GPU-hours",
                [*columns, Column("frontier")],
                fastest,
            )
        )
    footer = [
        (
            "step = max(compute, data-parallel comm) + TP comm + EP all-to-alls + pipeline point-to-point:"
            " data-parallel collectives ASSUMED overlapped with compute, TP/SP and EP collectives not; compute = the"
            " busiest GPU's micro-batches priced op by op on the GPU's calibration (the TP-local model's GEMMs,"
            " fused attention, memory-bound kernels), × the 1F1B bubble (k + pp − 1)/k, (k·v + pp − 1)/(k·v) with v virtual stages, + its AdamW step.  MFU:"
            " model FLOPs (3 × forward matmuls, attention's full square, no recompute) / (step × GPUs × bf16 peak);"
            " HFU: the busiest GPU's hardware FLOPs (recompute included) / (step × peak)."
        ),
        (
            "Per-GPU memory: the worst rank (analytic.parallel): byte-exact against one rank of the real job on the"
            " fake process group where the peak column says exact (`memory` with the layout says why a peak is"
            " an estimate); pipeline stages are replayed alone or beside data, tensor and sequence parallel"
            " with or without vocab parallel (exact), estimated beside DDP / ZeRO-1 × TP."
        ),
        context_parallel_words(p.seq),
    ]
    return View(header, tables, footer)


def _row(p: Plan, c) -> tuple:
    r = p.row(c)
    row = [
        r["layout"],
        r["gpus"],
        r["checkpoint"],
        r["micro_batch"],
        r["accumulation"],
        r["per_gpu_bytes"],
        "exact" if r["peak_exact"] else "estimate",
        r["step_seconds"],
        r["mfu"],
        r["hfu"],
        round(r["tokens_per_s"]),
        r["days"],
        round(r["gpu_hours"]),
    ]
    if p.price_per_gpu_hour is not None:
        row.append(round(r["cost"]))
    return tuple(row)


def efficiency_words(calibration: str, efficiency: float) -> str:
    """Where the step-time model's prices come from, and the --efficiency applied to them (when one is)."""
    if efficiency == 1:
        return f"the calibrated model, {calibration}"
    return f"the calibrated model, {calibration}, its compute / --efficiency {efficiency:g} (applied)"


def plot_memory_vs_gpus(
    curves: dict,
    memory_bytes: int,
    title: str,
    path_stem,
    *,
    memory_label: str = "GPU memory",
    setup=None,
    return_fig: bool = False,
):
    """Per-GPU memory against GPU count for the main layouts (``plan.memory_vs_gpus``), the GPU's
    memory as a line labelled '``memory_label`` = 84.9 GB'; the title's second line names the curves'
    training setup (``setup``, default ``plan.curve_setup()``, that of ``memory_vs_gpus``'s default).
    Written as PNG and SVG (the paths as str; ``return_fig``: and the figure); matplotlib is imported here only."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    from ..plan import curve_setup
    from .plots import save_figure  # atomic, byte-reproducible PNG and SVG (fixed SVG hash salt, no dates)
    from .words import setup_words

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    for label, points in curves.items():
        if points:
            ax.plot([w for w, _ in points], [b / 1e9 for _, b in points], marker="o", label=label)
    line = f"{memory_label} = {memory_bytes / 1e9:,.1f} GB"
    ax.axhline(memory_bytes / 1e9, color="black", linestyle="--", linewidth=1, label=line)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 8, 1024 GPUs; 20, 50, 100 GB rather than 2³, 2×10¹, 10²
    ax.yaxis.set_minor_locator(LogLocator(subs=(2, 3, 5)))
    ax.yaxis.set_minor_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.xaxis.set_major_formatter(plain)
    ax.tick_params(axis="both", which="both", labelsize=8)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("per-GPU peak + allowance (GB, 10⁹ bytes)")
    ax.set_title(f"{title}\n{setup_words(setup or curve_setup())}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the axes: no curve hidden
    fig.tight_layout()
    paths = [str(p) for p in save_figure(fig, path_stem, False)]
    return (paths, fig) if return_fig else paths


REPORT_MODELS = ("llama-3-8b", "llama-3.1-70b")
"""The committed planner examples (``reports/parallel/``): 8k context on 8..1024 H100s, 15T tokens."""


def write_parallel(out, plots: bool = True) -> list:
    """``reports/parallel/``: for each of ``REPORT_MODELS``, the planner's best layouts (markdown) and,
    with ``plots``, per-GPU memory against GPU count (PNG, SVG).  Returns the paths written."""
    from pathlib import Path

    from ..analytic.sizes import at_context
    from ..config import load_config
    from ..gpus import gpu
    from ..output import write_atomic
    from ..plan import memory_vs_gpus, plan
    from . import render

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in REPORT_MODELS:
        cfg = at_context(load_config(name), 8192)
        result = plan(cfg, "h100-80gb", (8, 1024), 8192, 4 * 1024 * 1024, 15 * 10**12, price_per_gpu_hour=2.0)
        paths.append(write_atomic(out / f"{name}-8k-plan.md", render(result, "markdown")))
        if plots:
            curves = memory_vs_gpus(cfg, 8192, (8, 1024))
            title = f"{cfg.name} at S = 8,192, micro-batch 1"
            stem = out / f"{name}-8k-memory-vs-gpus"
            g = gpu("h100-80gb")
            label = f"{g.label}: CUDA total"
            paths += [Path(p) for p in plot_memory_vs_gpus(curves, g.cuda_total, title, stem, memory_label=label)]
    return paths
