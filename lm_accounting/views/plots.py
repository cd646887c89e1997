"""Figures of a context sweep (one row per (model, context), columns as written by the sweep).

Each ``plot_*`` writes ``<stem>.png`` and ``<stem>.svg`` atomically and returns their paths
(``return_fig=True``: ``(paths, figure)``).  Figures are ``matplotlib.figure.Figure`` objects saved
through the non-interactive Agg (PNG) and SVG canvases: pyplot is never imported, so no GUI backend
is needed, no global backend is switched and no figure is left open.  FLOPs are matmul-only forward
FLOPs; GB = 10^9 bytes; on context axes 1k = 1,024 tokens.  Every plot works on a float copy of
the numeric columns it uses (exact Python ints beyond int64 arrive as object columns, which matplotlib
cannot draw).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, LogLocator, NullLocator

from ..output import safe_filename, write_with
from .words import NONE_FITS, plural, setup_from_label, setup_words

GROUPS = ("attention projections", "attention matmuls", "ffn", "lm head")
MEMORY = ("parameters", "gradients", "optimizer", "activations")
TEMPORARIES = "AdamW step temporaries"  # foreach AdamW's extra copy of v; 0 (not drawn) for fused AdamW
MEMORY_COLUMNS = {**{m: f"mem:{m}" for m in MEMORY}, TEMPORARIES: "mem:step_temporaries"}
PALETTE = {  # one color per FLOPs group and memory component, shared by every figure
    "attention projections": "#4C72B0",
    "attention matmuls": "#DD8452",
    "ffn": "#55A868",
    "lm head": "#8172B3",
    "parameters": "#4C72B0",
    "gradients": "#937860",
    "optimizer": "#8172B3",
    "activations": "#DD8452",
    TEMPORARIES: "#DA8BC3",
    "peak": "#222222",
    "budget": "#C44E52",
}
# (marker, line style); components equal on every row share one line (see _memory_parts)
MEMORY_STYLE = {
    "parameters": ("o", "-"),
    "gradients": ("x", (0, (4, 3))),
    "optimizer": ("^", "-"),
    "activations": ("o", "-"),
    TEMPORARIES: ("v", "-."),
}
TEXT_COLUMNS = {"model", "setup", "impl", "measured:device", "measured:run"}
OPTIONAL_NUMERIC = (
    "measured:flops",
    "measured:peak",
    "mem:peak_traced",
    "mem:step_temporaries",
    "mem:budget",
    "mem:max_context",
)
MODEL_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")
FLOPS_LABEL = "forward FLOPs (matmuls)"
GB_LABEL = "memory (GB = 10⁹ bytes)"
ENG = EngFormatter(places=0, sep=" ")  # 1e12 -> "1 T"
GB_FMT = FuncFormatter(lambda x, _=None: f"{x:,.0f}" if x >= 1 else f"{x:g}")


# ---------------------------------------------------------------- helpers
def fmt_tokens(n: float) -> str:
    n = round(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def _fmt_count(n: float) -> str:
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"  # 190 M, 1.06 B


def _context_axis(ax, contexts) -> None:
    """Log-2 x axis with a tick at every given context, labelled 128, 256, …, 16k."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted({int(c) for c in contexts})))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_tokens(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("context length (tokens)")


def _log_y(ax, fmt) -> None:
    """Log y axis labelled by ``fmt``; the 2× and 5× ticks are labelled too on a short range (< 2 decades)
    and outside the powers of 10 in view (so neither end of the axis is left unlabelled)."""
    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_major_formatter(fmt)

    def minor(y, _=None) -> str:
        lo, hi = ax.get_ylim()
        outside = not 10 ** math.ceil(math.log10(lo)) < y < 10 ** math.floor(math.log10(hi))
        return fmt(y) if math.log10(hi / lo) < 2 or outside else ""

    ax.yaxis.set_minor_formatter(FuncFormatter(minor))
    ax.grid(True, which="major", alpha=0.3)


def _models(frame) -> list[str]:
    """Model names ordered by parameter count (smallest first)."""
    return list(frame.groupby("model")["params"].first().sort_values().index)


def _model_colors(frame) -> dict[str, str]:
    return {m: MODEL_COLORS[i % len(MODEL_COLORS)] for i, m in enumerate(_models(frame))}


def _rows(frame, model):
    return frame[frame["model"] == model].sort_values("context")


def _require(frame, columns):
    """``frame`` with ``columns`` (and the optional numeric ones present) as float; ValueError names the missing."""
    missing = [c for c in columns if c not in frame.columns]
    if missing or frame.empty:
        raise ValueError(f"sweep frame lacks columns: {', '.join(missing)}" if missing else "sweep frame has no rows")
    numeric = dict.fromkeys(c for c in (*columns, *OPTIONAL_NUMERIC) if c in frame.columns and c not in TEXT_COLUMNS)
    return frame.assign(**{c: frame[c].astype(float) for c in numeric})  # None -> NaN; ints beyond int64 -> float


def _batch_note(frame) -> str:
    return "batch " + "/".join(str(b) for b in sorted({int(b) for b in frame["batch"]}))


def _setup_note(frame) -> str:
    """'sdpa attention, full checkpointing, amp-bf16, AdamW foreach' from the ``setup`` column (a
    ``TrainingSetup.label``); '' for a frame without one."""
    labels = sorted({x for x in frame.get("setup", ()) if isinstance(x, str)})
    return " / ".join(setup_words(setup_from_label(label)) for label in labels)


def _run_note(frame) -> str:
    """'batch 1 · naive attention, no checkpointing, fp32, AdamW foreach' (the setup when the frame has one)."""
    setup = _setup_note(frame)
    return _batch_note(frame) + (f" · {setup}" if setup else "")


def _flops_note(frame) -> str:
    """The FLOPs figures' lines under the title: the batch and the sweep's setup, and (with a setup)
    that forward matmul FLOPs do not depend on it."""
    note = _run_note(frame)
    return f"{note}\n(the sweep's setup; forward matmul FLOPs do not depend on it)" if _setup_note(frame) else note


def save_figure(fig: Figure, stem, return_fig: bool):
    """Write <stem>.png and <stem>.svg atomically (``files.write_with``); both byte-reproducible."""
    stem = Path(stem)
    paths, engine = [], fig.get_layout_engine()
    for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None})):

        def save(tmp: str, ext: str = ext, meta: dict = meta) -> None:
            with rc_context({"svg.hashsalt": "lm-accounting"}):
                fig.savefig(tmp, format=ext, dpi=150, metadata=meta)

        paths.append(write_with(stem.with_name(f"{stem.name}.{ext}"), save))
        fig.set_layout_engine("none")  # the SVG reuses the PNG's layout (same inches): one layout pass fewer
    fig.set_layout_engine(engine)
    return (paths, fig) if return_fig else paths


# ---------------------------------------------------------------- 1. shares vs context
def plot_flops_shares(frame, path_stem, *, ncols: int = 4, return_fig: bool = False):
    """Stacked area of each group's share of forward FLOPs against context, one panel per model."""
    frame = _require(frame, ["model", "context", "params", "batch", *(f"share:{g}" for g in GROUPS)])
    models = _models(frame)
    ncols = min(ncols, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig = Figure(figsize=(3.5 * ncols, 3.0 * nrows + 0.9), layout="constrained")
    fig.get_layout_engine().set(wspace=0.06)  # keep "16k" and the next panel's "128" apart
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax, model in zip(axes, models, strict=False):
        rows = _rows(frame, model)
        shares = [100 * rows[f"share:{g}"].to_numpy(float) for g in GROUPS]
        ax.stackplot(rows["context"], shares, labels=GROUPS, colors=[PALETTE[g] for g in GROUPS], alpha=0.9)
        _context_axis(ax, rows["context"])
        ax.set(
            title=f"{model} ({_fmt_count(rows['params'].iloc[0])} params)",
            ylim=(0, 100),
            xlim=(rows["context"].min(), rows["context"].max()),
        )
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0f}%"))
    for ax in axes[: len(models)][::ncols]:
        ax.set_ylabel("share of forward FLOPs (matmuls only)")
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(GROUPS))
    fig.suptitle(f"Where the forward FLOPs go as context grows\n{_flops_note(frame)}")
    return save_figure(fig, path_stem, return_fig)


# ---------------------------------------------------------------- 2. total, linear, quadratic
def crossover_context(frame, model) -> float:
    """S* where quadratic = linear: quadratic = q·S², linear = l·S, so S* = l/q (from any row)."""
    row = _rows(frame, model).iloc[-1]
    return float(row["flops:linear"]) * float(row["context"]) / float(row["flops:quadratic"])


def plot_flops_vs_context(frame, path_stem, *, return_fig: bool = False):
    """Total forward FLOPs and its ∝S and ∝S² parts on log-log axes, crossover S* marked.

    The parts are drawn from l·S and q·S² over the whole x range, which is widened (the unswept
    part shaded and its powers of 2 ticked) when an S* falls outside the sweep.
    """
    frame = _require(frame, ["model", "context", "params", "batch", "flops:total", "flops:linear", "flops:quadratic"])
    fig = Figure(figsize=(10.5, 5.5), layout="constrained")
    ax = fig.subplots()
    lo, hi = frame["context"].min(), frame["context"].max()
    quadratic = {m for m in _models(frame) if _rows(frame, m).iloc[-1]["flops:quadratic"]}  # a Mamba has none
    stars = {m: crossover_context(frame, m) for m in _models(frame) if m in quadratic}
    x_lo = min([lo / 1.2, *(s / 1.5 for s in stars.values())])
    x_hi = max([hi * 1.2, *(s * 1.5 for s in stars.values())])
    grid, y_star = np.geomspace(x_lo, x_hi, 200), []
    for model, color in _model_colors(frame).items():
        rows = _rows(frame, model)
        last = rows.iloc[-1]  # l = linear / S and q = quadratic / S², the same from any row
        lin, quad = last["flops:linear"] / last["context"], last["flops:quadratic"] / last["context"] ** 2
        ax.plot(rows["context"], rows["flops:total"], "o-", color=color, ms=4, lw=2)
        ax.plot(grid, lin * grid, "--", color=color, lw=1.2)
        if model not in stars:  # no attention layer: no quadratic part, no crossover
            continue
        s_star = stars[model]
        ax.plot(grid, quad * grid**2, ":", color=color, lw=1.5)
        ax.plot([s_star], [lin * s_star], "D", color=color, mec="black", ms=7, zorder=5)
        y_star.append(lin * s_star)
        ax.annotate(
            f"S* ≈ {s_star:,.0f}",
            (s_star, lin * s_star),
            xytext=(s_star, 0.02),
            textcoords=("data", "axes fraction"),
            rotation=90,
            ha="center",
            va="bottom",
            fontsize=8,
            color=color,
            bbox=dict(fc="white", ec="none", alpha=0.85, pad=1),
            arrowprops=dict(arrowstyle="-", color=color, lw=0.8, ls=(0, (1, 2))),
        )
    for a, b in ((x_lo, lo), (hi, x_hi)):
        if b / a > 1.3:
            ax.axvspan(a, b, color="0.93", zorder=0, label="outside the sweep (extrapolated)")
    _log_y(ax, ENG)
    ax.set(ylabel=FLOPS_LABEL, ylim=(frame["flops:total"].min() / 20, max([frame["flops:total"].max(), *y_star]) * 3))
    extended = x_hi > hi * 1.3 or x_lo < lo / 1.3
    powers = {2**k for k in range(math.ceil(math.log2(x_lo)), math.floor(math.log2(x_hi)) + 1)} if extended else set()
    _context_axis(ax, set(frame["context"]) | powers)
    ax.set_xlim(x_lo, x_hi)
    outside = lambda m: "" if lo <= stars[m] <= hi else " (outside sweep)"
    star = lambda m: f"S* = {stars[m]:,.0f}{outside(m)}" if m in stars else "no attention, no S*"
    handles = [Line2D([], [], color=c, lw=2, label=f"{m}: {star(m)}") for m, c in _model_colors(frame).items()]
    handles += [
        Line2D([], [], color="gray", ls=ls, marker=mk, label=lab)
        for ls, mk, lab in (
            ("-", "o", "total"),
            ("--", "", "linear part (∝ S)"),
            (":", "", "quadratic part (∝ S², QKᵀ+AV)"),
            ("", "D", "crossover S*:\nquadratic = linear"),
        )
    ]
    handles += ax.get_legend_handles_labels()[0][:1]  # the shaded span, if any
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(f"Forward FLOPs vs context: linear and quadratic parts\n{_flops_note(frame)}", fontsize=10.5)
    return save_figure(fig, path_stem, return_fig)


# ---------------------------------------------------------------- 3. memory vs context
def max_fitting_context(rows, budget_bytes) -> tuple[int | None, float | None]:
    """(largest swept context with peak ≤ budget, the crossing interpolated linearly in log-log)."""
    s, peak = rows["context"].to_numpy(float), rows["mem:peak"].to_numpy(float)
    fits = peak <= budget_bytes
    largest = int(s[fits].max()) if fits.any() else None
    if fits.all() or not fits[0]:
        return largest, None
    i = int(np.argmin(fits)) - 1  # the last fitting point before the first miss
    t = (math.log(budget_bytes) - math.log(peak[i])) / (math.log(peak[i + 1]) - math.log(peak[i]))
    return largest, float(math.exp(math.log(s[i]) + t * (math.log(s[i + 1]) - math.log(s[i]))))


def _exact_max_context(rows, budget_bytes) -> int | None:
    """The sweep's exact largest fitting context (column ``mem:max_context``), if computed for this budget."""
    if (
        "mem:max_context" not in rows
        or "mem:budget" not in rows
        or float(rows["mem:budget"].iloc[0]) != float(budget_bytes)
    ):
        return None
    value = rows["mem:max_context"].iloc[0]
    return None if value is None or math.isnan(value) else int(value)


def _memory_parts(rows) -> list[list[str]]:
    """The memory components to draw, in groups equal on every row (one line each: parameters =
    gradients whenever the gradients have the parameters' dtype); the AdamW step temporaries only
    where the frame has them (older frames do not) and they are nonzero."""
    names = list(MEMORY)
    temporaries = rows.get(MEMORY_COLUMNS[TEMPORARIES])
    if temporaries is not None and temporaries.fillna(0).any():
        names.insert(MEMORY.index("optimizer") + 1, TEMPORARIES)
    parts: dict[str, list[str]] = {}  # first component of a group -> the group
    for name in names:
        values = rows[MEMORY_COLUMNS[name]]
        first = next((f for f in parts if np.array_equal(rows[MEMORY_COLUMNS[f]], values)), name)
        parts.setdefault(first, []).append(name)
    return list(parts.values())


def _equal_label(names: list[str]) -> str:
    """'parameters = gradients', two names a line."""
    pairs = [" = ".join(names[i : i + 2]) for i in range(0, len(names), 2)]
    return " =\n".join(pairs)


def _fit_verdict(rows, budget_label: str, largest, crossing, exact) -> str:
    """The title's last line: the exact largest context if the sweep computed it, else the swept one."""
    if exact == 0:
        return f"largest context within {budget_label}: {NONE_FITS} (exact step model)"
    if exact:
        where = (
            ", above the swept contexts"
            if exact > rows["context"].max()
            else ", below the swept contexts"
            if exact < rows["context"].min()
            else ""
        )
        return f"largest context within {budget_label}: {plural(exact, 'token')} (exact step model){where}"
    if largest is None:
        first = rows["context"].iloc[0]
        return (
            f"largest swept context within {budget_label}: {NONE_FITS} (the shortest, {fmt_tokens(first)} "
            f"{'token' if first == 1 else 'tokens'}, needs {rows['mem:peak'].iloc[0] / 1e9:,.1f} GB)"
        )
    return f"largest swept context within {budget_label}: {fmt_tokens(largest)}" + (
        " (all fit)" if crossing is None else ""
    )


def _mark_fit(ax, budget: float, crossing, exact) -> None:
    """A star where the peak meets the budget inside the sweep: the exact context, else the interpolation."""
    if crossing is None:
        return
    where, how = (
        (exact, f"largest context that fits: {plural(exact, 'token')}\n(exact step model)")
        if exact
        else (crossing, f"peak = budget at ≈{crossing:,.0f} tokens\n(log-log interpolation)")
    )
    ax.axvline(where, color=PALETTE["budget"], ls=":", lw=1.2)
    ax.plot([where], [budget], "*", color=PALETTE["budget"], ms=14, mec="black", label=how)


def plot_memory_vs_context(
    frame,
    path_stem,
    *,
    model: str,
    budget_bytes: float = 80 * 10**9,
    budget_label: str = "80 GB",
    return_fig: bool = False,
):
    """One training step's memory components and peak (log-log, GB) against a budget line."""
    frame = _require(frame, ["model", "context", "batch", "mem:peak", *(f"mem:{m}" for m in MEMORY)])
    rows = _rows(frame, model)
    if rows.empty:
        raise ValueError(f"model {model!r} not in the frame; have {', '.join(_models(frame))}")
    fig = Figure(figsize=(9.5, 5.2), layout="constrained")
    ax = fig.subplots()
    x, budget = rows["context"], budget_bytes / 1e9
    modelled = bool(rows["mem:peak"].notna().any())  # else: an architecture the step replay does not model
    for part in _memory_parts(rows):
        if rows[MEMORY_COLUMNS[part[0]]].isna().all():
            continue  # activations of such an architecture
        marker, style = MEMORY_STYLE[part[0]]
        ax.plot(
            x,
            rows[MEMORY_COLUMNS[part[0]]] / 1e9,
            marker=marker,
            ls=style,
            ms=5,
            lw=1.6,
            color=PALETTE[part[0]],
            label=_equal_label(part),
        )
    if modelled:
        ax.plot(x, rows["mem:peak"] / 1e9, "s-", ms=4, lw=2.6, color=PALETTE["peak"], label="peak of the step")
    in_gb = "" if budget_label.strip().endswith(" GB") else f" = {budget:,.4g} GB"
    ax.axhline(budget, color=PALETTE["budget"], ls="--", lw=1.5, label=f"budget {budget_label}{in_gb}")
    if modelled:
        largest, crossing = max_fitting_context(rows, budget_bytes)
        exact = _exact_max_context(rows, budget_bytes)
        _mark_fit(ax, budget, crossing, exact)
    _log_y(ax, GB_FMT)
    ax.set_ylabel(GB_LABEL)
    _context_axis(ax, x)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    verdict = (
        _fit_verdict(rows, budget_label, largest, crossing, exact)
        if modelled
        else "model states only: its implementation's predictor does not model it (no activations, no peak)"
    )
    impl = f" (--impl {rows['impl'].iloc[0]})" if "impl" in rows else ""
    ax.set_title(f"{model}{impl}: memory of one training step vs context\n{_run_note(rows)}\n{verdict}")
    return save_figure(fig, path_stem, return_fig)


# ---------------------------------------------------------------- 4. predicted vs measured
def _measured_on(frame) -> str:
    """'live model on meta' from the ``measured:device`` column ('live model' without one)."""
    devices = sorted({d for d in frame.get("measured:device", ()) if isinstance(d, str)})
    return f"live model on {'/'.join(devices)}" if devices else "live model"


def plot_predicted_vs_measured(frame, path_stem, *, return_fig: bool = False):
    """Analytic FLOPs and peak memory (lines) with measured values (markers; NaN = not measured).

    "Measured" is FlopCounterMode on the live model and one training step of the live model under
    the storage tracker (meta, cpu) or the CUDA allocator, as the column ``measured:device`` says.
    The tracker sees the traced run, so when every measurement is the tracker's (``measured:run``) the
    analytic line is ``mem:peak_traced``; otherwise ``mem:peak`` (the plain run).
    """
    frame = _require(frame, ["model", "context", "batch", "params", "flops:total", "mem:peak"])
    measured = ("measured:flops", "measured:peak")  # absent, None or NaN: not measured
    frame = frame.assign(**{c: np.nan for c in measured if c not in frame})
    runs = {r for r in frame.get("measured:run", ()) if isinstance(r, str)}
    traced = runs == {"traced"} and "mem:peak_traced" in frame  # the storage tracker sees the traced run
    peak, run = ("mem:peak_traced", "traced-run ") if traced else ("mem:peak", "")
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    panels = fig.subplots(1, 2)
    specs = (
        ("flops:total", "measured:flops", FLOPS_LABEL, 1.0, ENG),
        (peak, "measured:peak", f"{run}peak {GB_LABEL}", 1e9, GB_FMT),
    )
    n_measured = 0
    for ax, (col, mcol, ylabel, scale, fmt) in zip(panels, specs, strict=False):
        for model, color in _model_colors(frame).items():
            rows = _rows(frame, model)
            got = rows[rows[mcol].notna()]
            n_measured += len(got)
            err = f"max |Δ| {100 * (got[mcol] / got[col] - 1).abs().max():.2f}%" if len(got) else "not measured"
            ax.plot(rows["context"], rows[col] / scale, "-", color=color, lw=1.6, label=f"{model} ({err})")
            ax.plot(got["context"], got[mcol] / scale, "o", color=color, mec="black", ms=6, ls="none")
        _log_y(ax, fmt)
        ax.set_ylabel(ylabel)
        _context_axis(ax, frame["context"])
        ax.legend(fontsize=8, loc="upper left", title="analytic: line · measured: ●", title_fontsize=8)
    panels[0].set_title("forward FLOPs: analytic vs FlopCounterMode (live model)", fontsize=10.5)
    panels[1].set_title(f"peak memory: analytic vs measured ({_measured_on(frame)})", fontsize=10.5)
    note = "" if n_measured else " (no measurements)"
    fig.suptitle(f"Predicted vs measured ({_run_note(frame)}){note}")
    return save_figure(fig, path_stem, return_fig)


# ---------------------------------------------------------------- 5. model comparison
def _label_bars(ax, bars, share, min_label: float, last: bool) -> None:
    """Each segment's share: inside (white) where it fits, else outside in dark text: right of the
    bar's end for the last segment, under the bar for one in the middle; none for an empty one."""
    ax.bar_label(
        bars,
        labels=[f"{100 * s:.1f}%" if s >= min_label else "" for s in share],
        label_type="center",
        fontsize=8,
        color="white",
    )
    for bar, s in zip(bars, share, strict=False):
        if not 0 < s < min_label:
            continue
        x, y, w, h = bar.get_x(), bar.get_y(), bar.get_width(), bar.get_height()
        where = (
            dict(xy=(x + w, y + h / 2), xytext=(3, 0), ha="left", va="center")
            if last
            else dict(xy=(x + w / 2, y), xytext=(0, -1), ha="center", va="top")
        )
        ax.annotate(
            f"{100 * s:.1f}%", textcoords="offset points", fontsize=8, color="0.2", annotation_clip=False, **where
        )


def plot_model_comparison(frame, path_stem, *, context: int = 1024, min_label: float = 0.04, return_fig: bool = False):
    """Horizontal stacked bars of group shares at one context, smallest model on top; a segment
    narrower than ``min_label`` has its share written outside the bar."""
    frame = _require(frame, ["model", "context", "params", "batch", *(f"share:{g}" for g in GROUPS)])
    at = frame[frame["context"] == context]
    if at.empty:
        have = ", ".join(fmt_tokens(c) for c in sorted(frame["context"].unique()))
        raise ValueError(f"context {context} not in the sweep; have {have}")
    at = at.set_index("model").loc[[m for m in _models(frame) if m in set(at["model"])]]
    fig = Figure(figsize=(9, 1.8 + 0.75 * len(at)), layout="constrained")
    ax = fig.subplots()
    ypos, left = np.arange(len(at))[::-1], np.zeros(len(at))
    for g in GROUPS:
        share = at[f"share:{g}"].to_numpy(float)
        bars = ax.barh(ypos, 100 * share, left=100 * left, color=PALETTE[g], label=g, height=0.7)
        _label_bars(ax, bars, share, min_label, last=g == GROUPS[-1])
        left += share
    ax.set_yticks(ypos, [f"{m}\n{_fmt_count(p)} params" for m, p in zip(at.index, at["params"], strict=False)])
    ax.set(xlim=(0, 100), xlabel="share of forward FLOPs (matmuls only)")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}%"))
    fig.legend(loc="outside lower center", ncols=len(GROUPS))
    ax.set_title(f"Forward FLOPs by component at context {context:,}\n{_flops_note(frame)}", fontsize=10.5)
    return save_figure(fig, path_stem, return_fig)


# ---------------------------------------------------------------- all of them
def plot_all(frame, out_dir, *, context: int = 1024, memory_models=None, **memory_options) -> list[Path]:
    """Write every figure into ``out_dir``: the memory one per model (default: all), predicted against
    measured where anything was measured, the comparison at ``context`` or, if that was not swept,
    the nearest swept context (on a log scale)."""
    out = Path(out_dir)
    paths = plot_flops_shares(frame, out / "flops_shares")
    paths += plot_flops_vs_context(frame, out / "flops_vs_context")
    for model in memory_models or _models(frame):
        stem = f"memory_vs_context_{safe_filename(str(model))}"  # a name never becomes a path
        paths += plot_memory_vs_context(frame, out / stem, model=model, **memory_options)
    measured = [c for c in ("measured:flops", "measured:peak") if c in frame]
    if measured and frame[measured].notna().any(axis=None):  # nothing measured: no such plot
        paths += plot_predicted_vs_measured(frame, out / "predicted_vs_measured")
    if context not in set(frame["context"]):
        context = int(min(frame["context"], key=lambda c: abs(math.log(c / context))))
    return paths + plot_model_comparison(frame, out / "model_comparison", context=context)
