"""The inference report (``reports/inference/``): serving Llama-3-8B and a Qwen3-30B-A3B-style mixture
of experts on one H100 SXM 80GB, bf16 weights and KV cache, from ``analytic.inference_report.infer``.

* ``serving.md``/``.csv``: a table at three prompt/generation lengths;
* ``decode_tokens_per_s.png``/``.svg``: decode tokens/s against the batch, the roofline knee marked;
* ``memory_vs_sequences.png``/``.svg``: peak memory against concurrent sequences, with the budget line.

Sequences are prefilled one at a time and decoded together (continuous batching), so the memory is
the decode step's at B plus one prompt's prefill temporaries, whichever is larger.  Attention is the
fused kernel (``--attention sdpa``, ``infer``'s default): no P×P scores are held.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..analytic.engine_runs import TRTLLM_SOURCE
from ..analytic.inference_report import _memory, infer
from ..config import ModelConfig, load_config
from ..gpus import gpu
from ..output import write_table_files
from .tables import Column, Table
from .words import NONE_FITS, plural

GPU = "h100-80gb"
LENGTHS = ((128, 128), (2048, 512), (4096, 1024))  # (prompt P, generated G)
BATCHES = tuple(2**i for i in range(11))  # 1 .. 1,024 sequences
TABLE_BATCH = 32
UNBOUNDED = 10**18  # the curves go past the budget (drawn dashed there)
FILES = (
    "serving.md",
    "serving.csv",
    "engine_startup.md",
    "engine_startup.csv",
    "trtllm_throughput.md",
    "trtllm_throughput.csv",
    *(f"{s}.{e}" for s in ("decode_tokens_per_s", "memory_vs_sequences") for e in ("png", "svg")),
)


def models() -> list[ModelConfig]:
    return [load_config("llama-3-8b"), load_config("qwen3-30b-a3b")]


ATTENTION = "sdpa"


PROGRAM = "engine"  # infer's default: last-token logits, a paged cache of P + G − 1 positions


def _serving_peak(cfg: ModelConfig, P: int, G: int, B: int) -> int:
    return _memory(cfg, P, G, B, "bf16", "bf16", 1, "filled", 1, ATTENTION, True, PROGRAM)["peak"]


def rows(cfgs: list[ModelConfig]) -> list[dict[str, Any]]:
    """One record per model × length × batch: tokens/s, bound, serving peak, and the length's knee and fit
    (``max_batch_serving`` within ``infer``'s default budget on ``GPU``, which the record carries)."""
    out = []
    for cfg in cfgs:
        for P, G in LENGTHS:
            served = infer(cfg, P, G, 1, gpu=GPU, attention=ATTENTION)
            budget, fit = served.budget, served.max_batch_serving
            knee = infer(cfg, P, G, 1, gpu=GPU, budget=UNBOUNDED, attention=ATTENTION).roofline["knee_batch_first"]
            at_knee = None
            if knee is not None and knee <= BATCHES[-1]:
                at_knee = infer(cfg, P, G, knee, gpu=GPU, budget=UNBOUNDED, attention=ATTENTION).roofline[
                    "tokens_per_s"
                ]
            for B in BATCHES:
                r = infer(cfg, P, G, B, gpu=GPU, budget=UNBOUNDED, attention=ATTENTION)
                ro = r.roofline
                out.append(
                    dict(
                        model=cfg.name,
                        prompt=P,
                        generate=G,
                        batch=B,
                        tokens_per_s=ro["tokens_per_s"],
                        decode_ms_per_token=1e3 * ro["decode_mean_seconds"],
                        decode_bound=ro["decode_bound"],
                        ttft_ms=1e3 * ro["time_to_first_token_seconds"],
                        serving_peak_bytes=_serving_peak(cfg, P, G, B),
                        kv_cache_per_sequence=r.memory["kv_cache_per_sequence"],
                        knee_batch=ro["knee_batch_first"],
                        knee_batch_weights_only=ro["knee_batch_weights_only"],
                        max_batch_serving=fit,
                        knee_tokens_per_s=at_knee,
                        weights=r.weights,
                        kv_dtype=r.kv_dtype,
                        attention=r.attention,
                        budget_bytes=budget,
                    )
                )
    return out


def serving_words(records: list[dict[str, Any]]) -> str:
    """'bf16 weights, bf16 KV cache, sdpa attention (engine program: ...)', from the records."""
    kinds = dict.fromkeys(
        f"{r['weights']} weights, {r['kv_dtype']} KV cache, {r['attention']} attention" for r in records
    )
    return " / ".join(kinds) + f" ({PROGRAM} program: last-token logits, paged KV cache)"


def fit_words(fit: int) -> str:
    """The serving capacity in a legend: 'at most 93 sequences fit', 'at most 1 sequence fits', 'none fits'."""
    return f"at most {plural(fit, 'sequence')} {'fits' if fit == 1 else 'fit'}" if fit else NONE_FITS


CAPACITY = "prompts prefilled one at a time, then decoded together"
"""What the capacity ``max_batch_serving`` counts (``max_batch(..., prefill_batch=1)``)."""


def budget_words(records: list[dict[str, Any]]) -> str:
    """'NVIDIA H100 SXM 80GB = 80.0 GB budget': the budget line's label, its value read from the records."""
    (budget,) = {r["budget_bytes"] for r in records}
    return f"{gpu(GPU).label} = {budget / 1e9:,.1f} GB budget"


def serving_table(records: list[dict[str, Any]]) -> Table:
    picked = [r for r in records if r["batch"] in (1, TABLE_BATCH)]
    table_rows = []
    for r1 in (r for r in picked if r["batch"] == 1):
        rb = next(
            r for r in picked if r["batch"] == TABLE_BATCH and r["model"] == r1["model"] and r["prompt"] == r1["prompt"]
        )
        fits = TABLE_BATCH <= r1["max_batch_serving"]
        table_rows.append(
            (
                r1["model"],
                r1["prompt"],
                r1["generate"],
                r1["kv_cache_per_sequence"],
                r1["max_batch_serving"],
                r1["ttft_ms"],
                r1["decode_ms_per_token"],
                r1["tokens_per_s"],
                rb["tokens_per_s"] if fits else None,
                rb["decode_bound"] if fits else f"B = {TABLE_BATCH} does not fit",
                "never" if r1["knee_batch"] is None else f"{r1['knee_batch']:,}",
                r1["knee_batch_weights_only"],
            )
        )
    g = gpu(GPU)
    (budget,) = {r["budget_bytes"] for r in records}
    return Table(
        f"Serving on one {g.label}: {serving_words(records)}, roofline at 100 % of the datasheet",
        [
            Column("model"),
            Column("prompt P", "int"),
            Column("generate G", "int"),
            Column("KV cache per sequence", "bytes"),
            Column(f"max sequences in {budget / 1e9:,.4g} GB", "int"),
            Column("TTFT at B = 1 (ms)", "float"),
            Column("decode ms/token at B = 1", "float"),
            Column("tokens/s at B = 1", "float"),
            Column(f"tokens/s at B = {TABLE_BATCH}", "float"),
            Column(f"bound at B = {TABLE_BATCH}"),
            Column("knee batch (decode compute-bound at p = P)"),
            Column("knee without KV reads", "int"),
        ],
        table_rows,
        [
            (
                "Roofline: time = max(FLOPs / 989.4 TFLOP/s, bytes / 3.35 TB/s); decode bytes = the weights read once per "
                "step (MoE: the experts of B·k routed tokens, at most all E) + the KV cache read; prefill FLOPs count "
                "the pairs a causal kernel computes."
            ),
            (
                f"Max sequences: {CAPACITY}, within {budget_words(records)}; peak = weights + KV(P + G − 1 positions "
                "in blocks of 16: the engine program) + the larger of one prefill's and the decode step's temporaries "
                "(the head on the last position only) (our live model with fused attention, sdpa: no "
                "P×P scores; for the MoE its course twin's, an estimate)."
            ),
            (
                "knee: the smallest B at which a decode step at p = P is compute-bound; 'never' when each sequence's KV "
                "reads grow as fast as its FLOPs (intensity per sequence below the ridge of 295 FLOP/byte)."
            ),
        ],
    )


def plot_tokens_per_s(records: list[dict[str, Any]], stem: Path, *, return_fig: bool = False):
    from matplotlib.figure import Figure

    from .plots import save_figure

    cfgs = list(dict.fromkeys(r["model"] for r in records))
    fig = Figure(figsize=(6.4 * len(cfgs), 5.6), layout="constrained")
    axes = fig.subplots(1, len(cfgs), squeeze=False)[0]
    colors = ("#4C72B0", "#DD8452", "#55A868")
    for ax, model in zip(axes, cfgs, strict=True):
        for (P, G), color in zip(LENGTHS, colors, strict=True):
            mine = [r for r in records if r["model"] == model and r["prompt"] == P]
            fit, knee = mine[0]["max_batch_serving"], mine[0]["knee_batch"]
            inside = [r for r in mine if r["batch"] <= fit]
            if knee is None:
                label = f"P = {P:,}, G = {G:,}: no knee (memory-bound at every B)"
            else:
                beyond = "" if knee <= BATCHES[-1] else ", beyond the axis"
                label = f"P = {P:,}, G = {G:,}: knee at B = {knee:,}{beyond}"
            label += f"; {fit_words(fit)}"
            ax.plot(
                [r["batch"] for r in mine], [r["tokens_per_s"] for r in mine], ls="--", lw=1, color=color, alpha=0.6
            )
            ax.plot(
                [r["batch"] for r in inside],
                [r["tokens_per_s"] for r in inside],
                marker="o",
                ms=3,
                color=color,
                label=label,
            )
            if mine[0]["knee_tokens_per_s"] is not None:
                ax.plot(
                    [knee],
                    [mine[0]["knee_tokens_per_s"]],
                    marker="D",
                    ms=8,
                    color=color,
                    mec="black",
                    mew=0.7,
                    zorder=5,
                )
            if fit <= BATCHES[-1]:
                ax.axvline(fit, color=color, lw=0.8, ls=":")
        ax.set(
            xscale="log",
            yscale="log",
            title=model,
            xlabel="concurrent sequences B (log)",
            ylabel="decode tokens/s, all sequences (roofline)",
        )
        ax.set_xticks(BATCHES, [f"{b:,}" for b in BATCHES])
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.13),
            title=f"◆ knee · dotted: most sequences that fit · dashed: beyond it\n({CAPACITY})",
            title_fontsize=7.5,
        )
    fig.suptitle(
        f"Decode throughput on one {gpu(GPU).label}, mean over the G − 1 steps (roofline)\n{serving_words(records)}",
        fontsize=11,
    )
    return save_figure(fig, stem, return_fig)


def plot_memory(records: list[dict[str, Any]], stem: Path, *, return_fig: bool = False):
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    from .plots import save_figure

    (budget,) = {r["budget_bytes"] for r in records}
    cfgs = list(dict.fromkeys(r["model"] for r in records))
    fig = Figure(figsize=(6.4 * len(cfgs), 4.9), layout="constrained")
    axes = fig.subplots(1, len(cfgs), squeeze=False)[0]
    colors = ("#4C72B0", "#DD8452", "#55A868")
    for ax, model in zip(axes, cfgs, strict=True):
        for (P, G), color in zip(LENGTHS, colors, strict=True):
            mine = [r for r in records if r["model"] == model and r["prompt"] == P]
            fit = mine[0]["max_batch_serving"]
            ax.plot(
                [r["batch"] for r in mine],
                [r["serving_peak_bytes"] / 1e9 for r in mine],
                marker="o",
                ms=3,
                color=color,
                label=f"P + G = {P + G:,}: {fit_words(fit)}",
            )
            if fit:
                ax.plot([fit], [budget / 1e9], marker="*", ms=13, color=color, mec="black", mew=0.6, zorder=5)
        ax.axhline(budget / 1e9, color="black", lw=1, ls="--", label=budget_words(records))
        ax.set(
            xscale="log",
            yscale="log",
            title=model,
            xlabel="concurrent sequences B (log)",
            ylabel="peak memory (GB = 10⁹ bytes, log)",
        )
        ax.set_xticks(BATCHES, [f"{b:,}" for b in BATCHES])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _=None: f"{y:,.0f}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _=None: f"{y:,.0f}" if f"{y:.0e}"[0] in "123568" else ""))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", title=f"★ most sequences that fit: {CAPACITY}", title_fontsize=8)
    fig.suptitle(
        f"Serving memory vs concurrent sequences (weights + KV cache + step temporaries)\n{serving_words(records)}",
        fontsize=11,
    )
    return save_figure(fig, stem, return_fig)


def vllm_table(records: list[dict[str, Any]]) -> Table:
    """Published vLLM start-ups beside ``engine_sizing`` (``analytic.engine_runs``): every row, its error."""

    def err(r, key):
        e = r[f"{key}_error"]
        return "" if e is None else f"{100 * e:+.2f} %"

    def pub(r, key, fmt):
        v = r.get(f"{key}_published")
        return "" if v is None else fmt.format(v)

    def ours(r, key, fmt):
        v = r.get(f"{key}_ours")
        return "" if v is None else fmt.format(v)

    body = [
        (r["run"], r["version"], r["kind"], f"{r['weights_gib_ours']:.4f}", pub(r, "weights_gib", "{:.4g}"),
         f"{r['kv_gib_ours']:.2f}", pub(r, "kv_gib", "{:.2f}"), err(r, "kv_gib"),
         f"{r['tokens_ours']:,}", pub(r, "tokens", "{:,}"), err(r, "tokens"),
         ours(r, "concurrency", "{:.2f}x"), pub(r, "concurrency", "{:.2f}x"))
        for r in records
    ]  # fmt: skip
    columns = ["run", "engine", "row", "weights GiB ours", "published", "KV cache GiB ours", "published", "error",
               "tokens ours", "published", "error", "concurrency ours", "published"]  # fmt: skip
    return Table(
        "Engine start-up sizing: published vLLM and SGLang runs beside `infer --engine vllm|sglang`",
        [Column(c) for c in columns],
        body,
        [
            (
                "predicted: the KV cache memory from the run's CUDA total, our weights, our activation estimate and "
                "0.1 GiB of non-torch memory; its error is in the two terms vLLM measures (activation peak, non-torch)."
            ),
            (
                "arithmetic: the log's KV cache memory given (--kv-cache-memory); the log prints GiB to 2 decimals "
                "(±0.005 GiB is ±2 blocks of 2 MiB)."
            ),
            (
                "The V0 row (PR #10511): V0's profiler reported 1.79 GiB of non-torch memory and a 1.26 GiB "
                "activation peak, against our 0.10 and 0.84 GiB; V1 (the rules here) measures them differently."
            ),
            (
                "Under tp 4 (Qwen3-235B) vLLM logs one rank's KV memory but takes the fewest blocks over the ranks: "
                "its tokens are 1.1 % below that rank's arithmetic.  SGLang's row: +9.1 % tokens; we leave out what "
                "the ranks hold before the pool beside the weights (NCCL and custom all-reduce buffers under tp 4, "
                "weight-loading temporaries), about 0.76 GiB of K and of V here."
            ),
            *(f'{r["run"]}: {r["source"]}: "{r["quote"]}"' for r in records),
        ],
    )


def trtllm_table(records: list[dict[str, Any]]) -> Table:
    """TensorRT-LLM's published H100 throughput beside the roofline's bound (``analytic.engine_runs``)."""

    def ratio(v):
        return "" if v is None else f"{v:.3f}"

    body = [
        (f"{r['model']} tp {r['tp']}", f"{r['input']:,} / {r['output']:,}", f"{r['published_tokens_per_s']:,.0f}",
         f"{r['bound_fp8_kv']:,.0f}", f"{r['batch_fp8_kv']:,}", ratio(r["published_over_bound_fp8_kv"]),
         f"{r['realistic_fp8_kv']:,.0f}" if r["realistic_fp8_kv"] else "", ratio(r["published_over_realistic"]),
         f"{r['bound_bf16_kv']:,.0f}", ratio(r["published_over_bound_bf16_kv"]))
        for r in records
    ]  # fmt: skip
    over = [r for r in records if (r["published_over_bound_bf16_kv"] or 0) > 1]
    columns = ["model", "input / output", "TensorRT-LLM tokens/s", "bound (fp8 KV)", "at B", "published / bound",
               "calibrated", "published / calibrated", "bound (bf16 KV)", "published / bound (bf16 KV)"]  # fmt: skip
    return Table(
        "Serving throughput on H100 80GB: TensorRT-LLM's published runs beside `infer`'s roofline (fp8 w8a8)",
        [Column(c) for c in columns],
        body,
        [
            f"Published: {TRTLLM_SOURCE}.",
            (
                "bound: output tokens/s of the roofline (FP8 peak 1,978.9 TFLOP/s, HBM 3.35 TB/s, TP all-reduces added) "
                "at the largest batch that fits 79.11 GiB less 3 GB, B sequences prefilled then decoded: B·G over "
                "prefill(B) + Σ decode(B).  calibrated: the same at this project's measured H100 rates "
                "(reports/calibration/h100-80gb.md)."
            ),
            (
                f"With a bf16 KV cache the published figure exceeds the bound on {len(over)} of {len(records)} rows: "
                "those runs held more sequences than a bf16 cache allows, so their cache was fp8; the fp8-KV bound "
                "holds on every row (tests/test_engine_sizing.py)."
            ),
        ],
    )


def write_inference(out: Path, plots: bool = True) -> list[Path]:
    """Write the inference report into ``out`` (created if needed); returns the paths."""
    from ..analytic.engine_runs import rows as vllm_rows
    from ..analytic.engine_runs import throughput_rows

    out.mkdir(parents=True, exist_ok=True)
    records = rows(models())
    paths = write_table_files(out / "serving", [serving_table(records)], records)
    published = vllm_rows()
    paths += write_table_files(out / "engine_startup", [vllm_table(published)], published)
    trtllm = throughput_rows()
    paths += write_table_files(out / "trtllm_throughput", [trtllm_table(trtllm)], trtllm)
    if plots:
        paths += plot_tokens_per_s(records, out / "decode_tokens_per_s")
        paths += plot_memory(records, out / "memory_vs_sequences")
    return paths
