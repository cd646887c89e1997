"""Published training runs beside our predicted throughput: the error and its cause, row by row (issue 28, item 4).

Each run is a published figure with its layout, batch and sequence stated (``source``: the file or paper and its
table).  One rule predicts every row (``RULE``), no constant per row:

1. u, the calibrated efficiency: the hardware FLOPs of one GPU's training step of the whole model at the run's
   sequence S, micro-batch b and checkpointing (``hardware_flops.step_flops``: matmuls, recompute included), over
   the calibrated H100 time of that step's forward and backward (``step_time.predict_step_time``, the course
   program priced by ``lm_accounting/calibration/h100-80gb/``: GEMMs at their measured rates, fused attention,
   every memory-bound kernel), as a fraction of the H100's bf16 peak.  The AdamW step is left out (sharded over
   the data-parallel ranks, under 2 % of these steps).
2. The step: ``plan.price_layout`` of the run's own layout at utilisation u (``plan``'s rules 1-4: the busiest
   rank's hardware FLOPs at u, the 1F1B bubble, TP/SP and expert collectives exposed, data-parallel collectives
   overlapped, NVLink within a node and 50 GB/s per GPU between nodes); no memory check (the run ran).
3. Predicted tokens/s per GPU = global batch · S / step / GPUs; error = predicted / published - 1.

Every run is priced as bf16 compute, eager, on an H100 SXM 80GB (the calibrated part) or, for an A100 run, on the
A100's bf16 peak at the H100's u (no A100 calibration: such rows are out of the summary).  A run that used what the
rule cannot express (Float8, torch.compile, async TP, context parallel, an interleaved schedule, FP8) says so in
``differences``; each difference names the direction it moves the error ("+": the run is faster than the rule
assumes, so we under-predict; "-": slower, so we over-predict).  A row is out of the summary when it used Float8,
FP8, torch.compile, context parallel or an A100 (``EXCLUDE``); the rest form the summary.  The cause of a row worse
than 10 % is its differences acting in the error's direction, and the predicted step's exposed TP share and
pipeline bubble where above 10 %.

Published figures in TFLOP/s per GPU are converted to tokens/s with the convention the source states (``Run.convention``).
No torch.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from ..config import load_config
from ..gpus import gpu
from ..layout import ParallelLayout
from ..plan import price_layout, step_seconds
from ..setup import TrainingSetup
from .hardware_flops import step_flops
from .params import embedding_params, parameter_breakdown
from .step_time import predict_step_time

CALIBRATED = "h100-80gb"
RULE = (
    "u = hardware FLOPs of the whole model's step at (S, b, checkpointing) / its calibrated H100 forward + backward "
    "time / H100 bf16 peak; step = plan.price_layout(own layout, mfu=u); tokens/s/GPU = global batch · S / step / GPUs"
)
EXCLUDE = ("float8", "fp8", "compile", "cp", "a100")
"""Flags that keep a row out of the error summary (the rule cannot express them)."""

TT_2412 = (
    "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md "
    "(torchtitan 9dec370, 2024-12)"
)
TT_ASYNC = (
    "https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md "
    "(torchtitan 820504e, 2025-06)"
)
TT_PERF = "https://github.com/pytorch/torchtitan/blob/9dec370ad26b5f8e9a7333a0e36165018262644b/docs/performance.md"
LLAMA3 = "Llama Team, The Llama 3 Herd of Models, arXiv:2407.21783, Table 4 (405B pre-training on H100, BF16)"
NEMO_2407 = (
    "https://github.com/NVIDIA/NeMo/blob/070a0bb168d405d653b9734c0017cf5078e77c0d/docs/source/performance/"
    "performance_summary.md (NeMo 24.07, DGX-H100, FP8), Pretraining table"
)

# what a run did that the rule does not: (flag, direction, words)
POWER = (
    "",
    "-",
    "H100 HBM2e 94-96 GB at its default 500 W limit (torchtitan's note): slower clocks than the 700 W SXM part calibrated",
)
SAC_OP = ("", "-", "torchtitan's per-op SAC recomputes every second mm in backward; ours saves every mm")
COMPILE = ("compile", "+", "torch.compile fuses the memory-bound ops the calibrated time prices one kernel each")
FLOAT8 = ("float8", "+", "Float8 linear layers (torchao) run the GEMMs on FP8 tensor cores; priced at bf16")
FP8 = ("fp8", "+", "FP8 GEMMs (Transformer Engine); priced at bf16")
ASYNC_TP = ("", "+", "async TP overlaps the TP collectives we count exposed")
INTERLEAVED = ("", "+", "an interleaved (virtual-stage) schedule has a smaller bubble than the 1F1B we price")
CP = ("cp", "", "context parallel: not modelled (no prediction)")
A100_WORDS = (
    "A100: no A100 calibration; priced at the A100's bf16 peak with the H100's calibrated u, but the A100's "
    "memory-bound kernels cost less beside its GEMMs (2.0 TB/s per 312 TFLOP/s against the H100's 3.35 per 989), "
    "so it likely reaches a larger share of its peak"
)
A100 = ("a100", "+", A100_WORDS)
NEMO_WORDS = (
    "Megatron overlaps TP collectives with GEMMs (tp-comm-overlap) and the gradient reduction with the backward"
)
NEMO_OVERLAP = ("", "+", NEMO_WORDS)


@dataclass(frozen=True)
class Run:
    name: str
    source: str  # file or paper, and its table
    model: str  # a preset
    gpu: str  # priced on (``gpus``): h100-80gb, or a100-80gb
    hardware: str  # as published
    gpus: int
    dp: int
    zero: int  # 3: FSDP (reshard after forward), 2: FSDP without resharding, 1: distributed optimizer
    tp: int
    pp: int
    cp: int
    seq: int
    micro_batch: int  # sequences per micro-batch
    global_batch: int  # sequences per step
    checkpoint: str  # ours: none | full | selective
    published_checkpoint: str
    published: float
    unit: str  # tokens/s/GPU | TFLOP/s/GPU
    convention: str  # how the published figure counts FLOPs (TFLOP/s) or tokens
    differences: tuple[tuple[str, str, str], ...] = ()
    overrides: tuple[tuple[str, Any], ...] = ()  # the run's model where it is not the preset

    @property
    def flags(self) -> set[str]:
        return {f for f, _, _ in self.differences if f}

    @property
    def layout(self) -> ParallelLayout:
        k = self.global_batch // self.dp // self.micro_batch
        return ParallelLayout(dp=self.dp, zero=self.zero if self.dp > 1 else 0, tp=self.tp,
                              sequence_parallel=self.tp > 1, vocab_parallel=self.tp > 1, pp=self.pp,
                              micro_batches=k)  # fmt: skip


def _tt(name, gpus, dp, tp, pp, seq, b, gbs, ck, pck, tps, diffs, model="llama-3.1-8b", source=TT_2412, cp=1):
    return Run(name, source, model, CALIBRATED, "H100 HBM2e 96 GB, 500 W (Grand Teton)", gpus, dp, 3, tp, pp, cp,
               seq, b, gbs, ck, pck, tps, "tokens/s/GPU", "TPS/GPU read at step 90" if source == TT_2412 else "tokens/sec per GPU", (POWER, *diffs))  # fmt: skip


LLAMA2_7B = (("vocab_size", 32000), ("num_kv_heads", 32), ("d_ff", 11008), ("context_length", 4096))
LLAMA2_13B = LLAMA2_7B + (("num_layers", 40), ("d_model", 5120), ("num_heads", 40), ("num_kv_heads", 40),
                          ("d_ff", 13824))  # fmt: skip
LLAMA2_70B = (("vocab_size", 32000), ("context_length", 4096))
META_TFLOPS = (
    "TFLOP/s per GPU, BF16 MFU = it / 989 TFLOP/s; the paper does not state its FLOP count: taken as torchtitan's "
    "(Meta's) 6·(N - embedding) + 12·l·d·S per token (attention not halved)"
)
NEMO = "Tokens/sec/GPU (Model TFLOP/sec/GPU also published)"

RUNS = (
    # torchtitan, end of 2024 (Table 1: 8 GPUs; Table 3: 128 GPUs), selective op AC, local batch 2, S = 8,192
    _tt("TT T1 8B FSDP 8", 8, 8, 1, 1, 8192, 2, 16, "selective", "selective (op)", 5762, (SAC_OP,)),
    _tt("TT T1 8B FSDP 8 + compile", 8, 8, 1, 1, 8192, 2, 16, "selective", "selective (op)", 6667, (SAC_OP, COMPILE)),
    _tt("TT T1 8B FSDP 8 + compile + Float8", 8, 8, 1, 1, 8192, 2, 16, "selective", "selective (op)", 8532,
        (SAC_OP, COMPILE, FLOAT8)),
    _tt("TT T3 8B FSDP 128", 128, 128, 1, 1, 8192, 2, 256, "selective", "selective (op)", 5605, (SAC_OP,)),
    _tt("TT T3 8B FSDP 128 + compile", 128, 128, 1, 1, 8192, 2, 256, "selective", "selective (op)", 6514,
        (SAC_OP, COMPILE)),
    _tt("TT T3 8B FSDP 128 + compile + Float8", 128, 128, 1, 1, 8192, 2, 256, "selective", "selective (op)", 8380,
        (SAC_OP, COMPILE, FLOAT8)),
    # Table 2: FSDP + CP + compile + Float8, local batch 1, full AC
    _tt("TT T2 8B FSDP 8 CP 1, S 32k", 8, 8, 1, 1, 32768, 1, 8, "full", "full", 3890, (COMPILE, FLOAT8)),
    _tt("TT T2 8B FSDP 4 CP 2, S 64k", 8, 4, 1, 1, 65536, 1, 4, "full", "full", 2540, (COMPILE, FLOAT8, CP), cp=2),
    # Table 4: 70B, FSDP 32 × TP 8, local batch 16, global 512, full AC, compile + Float8
    _tt("TT T4 70B FSDP 32 TP 8", 256, 32, 8, 1, 8192, 16, 512, "full", "full", 829, (COMPILE, FLOAT8),
        model="llama-3.1-70b"),
    _tt("TT T4 70B FSDP 32 TP 8 + async TP", 256, 32, 8, 1, 8192, 16, 512, "full", "full", 876,
        (COMPILE, FLOAT8, ASYNC_TP), model="llama-3.1-70b"),
    # Table 5: 405B, FSDP 8 × TP 8 × PP 8, local batch 32 (micro-batches of 1), global 256, full AC
    _tt("TT T5 405B FSDP 8 TP 8 PP 8, 1F1B", 512, 8, 8, 8, 8192, 1, 256, "full", "full", 100,
        (COMPILE, FLOAT8, ASYNC_TP), model="llama-3.1-405b"),
    _tt("TT T5 405B FSDP 8 TP 8 PP 8, interleaved 1F1B", 512, 8, 8, 8, 8192, 1, 256, "full", "full", 128,
        (COMPILE, FLOAT8, ASYNC_TP, INTERLEAVED), model="llama-3.1-405b"),
    # torchtitan async TP, 2025-06: bf16 rows (vanilla and async TP), torch.compile on
    _tt("TT async-TP 70B FSDP 32 TP 8, bf16", 256, 32, 8, 1, 8192, 16, 512, "full", "full", 597.3, (COMPILE,),
        model="llama-3.1-70b", source=TT_ASYNC),
    _tt("TT async-TP 70B FSDP 32 TP 8, bf16 + async TP", 256, 32, 8, 1, 8192, 16, 512, "full", "full", 652.4,
        (COMPILE, ASYNC_TP), model="llama-3.1-70b", source=TT_ASYNC),
    _tt("TT async-TP 8B FSDP 8 TP 8, bf16", 64, 8, 8, 1, 8192, 12, 96, "selective", "selective (op)", 4378,
        (SAC_OP, COMPILE), source=TT_ASYNC),
    _tt("TT async-TP 8B FSDP 8 TP 8, bf16 + async TP", 64, 8, 8, 1, 8192, 12, 96, "selective", "selective (op)",
        4809.4, (SAC_OP, COMPILE, ASYNC_TP), source=TT_ASYNC),
    # torchtitan docs/performance.md (2024): 405B on 128 H100 (95 GB, lower TDP), FSDP 16 × TP 8, local batch 2
    Run("TT perf 405B FSDP 16 TP 8", TT_PERF + " (Llama 3.1 table, row 'None')", "llama-3.1-405b", CALIBRATED,
        "H100 HBM2e 95 GB, lower TDP", 128, 16, 3, 8, 1, 1, 8192, 2, 32, "full", "full", 109, "tokens/s/GPU",
        "WPS (MFU 29.0 % published beside it); torch.compile not stated", (POWER,)),
    # torchtitan docs/performance.md (2024): 64 A100 80GB, FSDP 64, local batch 1
    Run("TT perf 8B FSDP 64 A100", TT_PERF + " (Llama 3 table, 'selective op')", "llama-3-8b", "a100-80gb",
        "A100 80GB", 64, 64, 3, 1, 1, 1, 8192, 1, 64, "selective", "selective (op)", 2973, "tokens/s/GPU",
        "WPS (MFU 58.2 % published beside it)", (A100, SAC_OP)),
    Run("TT perf 70B FSDP 64 A100", TT_PERF + " (Llama 3 table, '70B full')", "llama-3.1-70b", "a100-80gb",
        "A100 80GB", 64, 64, 3, 1, 1, 1, 8192, 1, 64, "full", "full", 331, "tokens/s/GPU",
        "WPS (MFU 51.7 % published beside it)", (A100,)),
    # The Llama 3 paper, Table 4 (16M tokens a step; micro-batch 1 taken: the table gives batch size per DP rank)
    Run("Llama 3 405B 8,192 GPUs TP 8 PP 16 DP 64", LLAMA3 + ", row 1", "llama-3.1-405b", CALIBRATED,
        "H100 80GB HBM3, 700 W", 8192, 64, 2, 8, 16, 1, 8192, 1, 2048, "full", "not stated (full taken)", 430,
        "TFLOP/s/GPU", META_TFLOPS, (INTERLEAVED,)),
    Run("Llama 3 405B 16,384 GPUs TP 8 PP 16 DP 128", LLAMA3 + ", row 2", "llama-3.1-405b", CALIBRATED,
        "H100 80GB HBM3, 700 W", 16384, 128, 2, 8, 16, 1, 8192, 1, 2048, "full", "not stated (full taken)", 400,
        "TFLOP/s/GPU", META_TFLOPS, (INTERLEAVED,)),
    Run("Llama 3 405B 16,384 GPUs TP 8 CP 16 PP 16 DP 8", LLAMA3 + ", row 3", "llama-3.1-405b", CALIBRATED,
        "H100 80GB HBM3, 700 W", 16384, 8, 2, 8, 16, 16, 131072, 1, 128, "full", "not stated (full taken)", 380,
        "TFLOP/s/GPU", META_TFLOPS, (INTERLEAVED, CP)),
    # NVIDIA NeMo 24.07, DGX-H100, FP8 (Transformer Engine), distributed optimizer, MBS 1
    Run("NeMo LLAMA2-7B 8 GPUs", NEMO_2407, "llama-3-8b", CALIBRATED, "DGX-H100", 8, 8, 1, 1, 1, 1, 4096, 1, 128,
        "none", "not stated (none taken)", 16847, "tokens/s/GPU", NEMO, (FP8, NEMO_OVERLAP), LLAMA2_7B),
    Run("NeMo LLAMA2-13B 16 GPUs PP 4 VP 10", NEMO_2407, "llama-3-8b", CALIBRATED, "DGX-H100", 16, 4, 1, 1, 4, 1,
        4096, 1, 128, "none", "not stated (none taken)", 8646, "tokens/s/GPU", NEMO, (FP8, NEMO_OVERLAP, INTERLEAVED),
        LLAMA2_13B),
    Run("NeMo LLAMA2-70B 64 GPUs TP 4 PP 4 VP 20", NEMO_2407, "llama-3.1-70b", CALIBRATED, "DGX-H100", 64, 4, 1, 4,
        4, 1, 4096, 1, 128, "none", "not stated (none taken)", 1707, "tokens/s/GPU", NEMO,
        (FP8, NEMO_OVERLAP, INTERLEAVED), LLAMA2_70B),
    Run("NeMo LLAMA3-8B 8 GPUs CP 2", NEMO_2407, "llama-3-8b", CALIBRATED, "DGX-H100", 8, 4, 1, 1, 1, 2, 8192, 1, 128,
        "none", "not stated (none taken)", 12036, "tokens/s/GPU", NEMO, (FP8, NEMO_OVERLAP, CP)),
)  # fmt: skip
"""The runs (see each ``source``).  Llama-2 is not a preset: Llama-3-8B's preset with Llama-2's config.json
sizes (vocabulary 32,000; 7B: 32 KV heads, intermediate 11,008; 13B: 40 layers, hidden 5,120, 40 heads, 40 KV
heads, intermediate 13,824; 70B: Llama-3.1-70B's sizes, vocabulary 32,000)."""


def config(run: Run):
    cfg = load_config(run.model)
    return dataclasses.replace(cfg, **dict(run.overrides)) if run.overrides else cfg


def setup(run: Run) -> TrainingSetup:
    return TrainingSetup(attention="sdpa", checkpoint=run.checkpoint, precision="amp-bf16")


def calibrated_efficiency(run: Run) -> float:
    """Rule step 1: u, the whole model's hardware FLOPs at (S, b) over its calibrated forward + backward time, as a
    fraction of the calibrated GPU's bf16 peak."""
    cfg, s = config(run), setup(run)
    t = predict_step_time(cfg, run.seq, s, impl="course", batch=run.micro_batch, gpu=CALIBRATED)
    flops = step_flops(cfg, run.seq, run.micro_batch, s).hardware
    return flops / (t.forward.seconds + t.backward.seconds) / gpu(CALIBRATED).peak_flops("bf16")


def model_flops_per_token(run: Run) -> float:
    """``META_TFLOPS``' convention: 6·(N - embedding) + 12·l·d·S (torchtitan's ``get_num_flop_per_token``)."""
    cfg = config(run)
    n = parameter_breakdown(cfg).total - embedding_params(cfg)
    return 6 * n + 12 * cfg.num_layers * cfg.num_heads * cfg.d_head * run.seq


def published_tokens_per_s(run: Run) -> float:
    if run.unit == "tokens/s/GPU":
        return run.published
    return run.published * 1e12 / model_flops_per_token(run)


def compare(run: Run) -> dict[str, Any]:
    """One row: the run as published beside the rule's prediction, the error and its cause."""
    lay = run.layout
    row: dict[str, Any] = {
        "run": run.name, "model": run.model + (" (resized)" if run.overrides else ""), "hardware": run.hardware,
        "priced_on": run.gpu, "gpus": run.gpus, "layout": f"{lay.label}" + (f"·cp{run.cp}" if run.cp > 1 else ""),
        "seq": run.seq, "micro_batch": run.micro_batch, "micro_batches": lay.micro_batches,
        "global_batch": run.global_batch, "checkpoint": run.checkpoint, "published_checkpoint": run.published_checkpoint,
        "published": run.published, "unit": run.unit, "convention": run.convention,
        "published_tokens_per_s": published_tokens_per_s(run),
    }  # fmt: skip
    predicted = None
    if "cp" not in run.flags:
        cfg, s = config(run), setup(run)
        u = calibrated_efficiency(run)
        times = price_layout(cfg, run.gpu, run.seq, run.micro_batch, s, lay, mfu=u)
        step = step_seconds(*times)
        predicted = run.global_batch * run.seq / step / run.gpus
        row.update(u=u, step_s=step, compute_s=times[0], dp_comm_s=times[1], tp_comm_s=times[2], pp_comm_s=times[3])
        row["bubble"] = (run.pp - 1) / (lay.micro_batches + run.pp - 1)
    else:
        row.update(u=None, step_s=None, compute_s=None, dp_comm_s=None, tp_comm_s=None, pp_comm_s=None, bubble=None)
    row["predicted_tokens_per_s"] = predicted
    error = None if predicted is None else predicted / row["published_tokens_per_s"] - 1
    row["error"] = error
    out = sorted(run.flags & set(EXCLUDE))
    row["in_summary"] = not out
    row["excluded_because"] = ", ".join(out)
    row["differences"] = "; ".join(f"({d or '?'}) {w}" for _, d, w in run.differences)
    row["cause"] = cause(run, row)
    row["source"] = run.source
    return row


def cause(run: Run, row: dict[str, Any]) -> str:
    """Where |error| > 10 %: the run's differences acting in the error's direction ("-": we over-predict,
    "+": we under-predict), and the predicted step's exposed TP share and 1F1B bubble where above 10 %."""
    error = row["error"]
    if error is None:
        return "not predicted: " + "; ".join(w for f, _, w in run.differences if f == "cp")
    if abs(error) <= 0.10:
        return ""
    sign = "-" if error > 0 else "+"
    parts = [w for _, d, w in run.differences if d == sign]
    if row["tp_comm_s"] / row["step_s"] > 0.10:
        parts.append(f"TP collectives counted exposed: {100 * row['tp_comm_s'] / row['step_s']:.0f} % of the step")
    if row["bubble"] > 0.10:
        parts.append(f"1F1B bubble {100 * row['bubble']:.0f} % of the compute")
    return "; ".join(parts) or "unexplained by the differences listed"


def rows() -> list[dict[str, Any]]:
    return [compare(run) for run in RUNS]


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The median and worst |error| over the rows in the summary, and the count over 10 %."""
    errors = [abs(r["error"]) for r in records if r["in_summary"] and r["error"] is not None]
    return {
        "rows": len(records),
        "in_summary": len(errors),
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "over_10pct": sum(e > 0.10 for e in errors),
    }
