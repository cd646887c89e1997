"""Published training runs beside our predicted throughput: the error and its cause, row by row (issue 28, item 4).

Each run is a published figure with its layout, batch and sequence stated (``source``: the file or paper and its
table).  One rule predicts every row (``RULE``), no constant per row:

1. The step: ``plan.estimate_step`` of the run's own layout, the step-time model ``plan``, ``train-time`` and
   ``memory`` print (``plan``'s rules 1-4): the busiest GPU's micro-batches priced op by op on the GPU's
   calibration (the TP-local program at the run's S, micro-batch b and checkpointing: the course program, or
   for llm-foundry's MPT rows the program MPT ran, ``ops.llmfoundry``, in bf16 as FSDP's MixedPrecision gathers
   its parameters, its Triton attention at ``step_time.TRITON_FLASH_SLOWDOWN``; GEMMs at their
   measured rates, fused attention, every memory-bound kernel; its share of the rank's hardware FLOPs under
   pp or vocab parallel), the 1F1B bubble (a run with an interleaved schedule whose virtual stages its source
   states is priced with them: ``Run.virtual_stages``, cited in ``Run.virtual_source``), its AdamW step, TP/SP and expert collectives exposed, data-parallel
   collectives overlapped, NVLink within a node and 50 GB/s per GPU between nodes; no memory check (the run ran).
2. Predicted tokens/s per GPU = global batch · S / step / GPUs; error = predicted / published - 1.

Every run is priced as bf16 compute, eager, on an H100 SXM 80GB (lm_accounting/calibration/h100-80gb/) or, for an
A100 run, on the H100's calibration scaled to the A100 (``step_time``: GEMMs and attention by the dense bf16 peak,
memory-bound kernels and AdamW by the HBM bandwidth): those rows measure that rule's error, in the summary.  A run that used what the
rule cannot express (Float8, torch.compile, async TP, context parallel, an interleaved schedule of unstated virtual
stages, FP8) says so in
``differences``; each difference names the direction it moves the error ("+": the run is faster than the rule
assumes, so we under-predict; "-": slower, so we over-predict).  A row is out of the summary when it used Float8,
FP8, torch.compile or context parallel (``EXCLUDE``); the rest form the summary, the A100 rows included.  The cause of a row worse
than 10 % (``cause``) is its differences acting in the error's direction and the terms of the predicted step that
could carry the error (fused attention or memory-bound kernels from 20 % of the calibrated compute, exposed TP
collectives, the 1F1B bubble, exposed pipeline sends, data-parallel collectives longer than the compute).

Published figures in TFLOP/s per GPU are converted to tokens/s with the convention the source states (``Run.convention``).
No torch.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from ..config import load_config
from ..layout import ParallelLayout
from ..plan import DEFAULT_INTERNODE, GPUS_PER_NODE, StepEstimate, estimate_step
from ..setup import TrainingSetup
from .params import embedding_params, parameter_breakdown
from .step_time import TRITON_FLASH_SLOWDOWN

CALIBRATED = "h100-80gb"
RULE = (
    "step = plan.estimate_step(own layout, S, b, checkpointing): the calibrated model plan prints "
    "(H100 table; an A100 on it scaled by peak and bandwidth); tokens/s/GPU = global batch · S / step / GPUs"
)
EXCLUDE = ("float8", "fp8", "compile", "cp")
"""Flags that keep a row out of the error summary (the rule cannot express them; "cp" only where CP is not priced)."""

TT_2412 = (
    "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md "
    "(torchtitan 9dec370, 2024-12)"
)
TT_ASYNC = (
    "https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md "
    "(torchtitan 820504e, 2025-06)"
)
TT_PERF = "https://github.com/pytorch/torchtitan/blob/9dec370ad26b5f8e9a7333a0e36165018262644b/docs/performance.md"
TT_H200 = (
    "https://github.com/pytorch/torchtitan/blob/b5bcd76c6/benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md "
    "(Trainy on WhiteFiber, 2025-06; torchtitan e7c0cae's llama3_8b.toml: seq_len 8,192, selective op AC, FSDP over "
    "every rank; --training.local_batch_size=2 --training.compile, float8 linears with float8 all-gathers)"
)
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
COMPILE = ("compile", "+", "torch.compile fuses the memory-bound ops the calibrated time prices one kernel each")
FLOAT8 = ("float8", "+", "Float8 linear layers (torchao) run the GEMMs on FP8 tensor cores; priced at bf16")
FP8 = ("fp8", "+", "FP8 GEMMs (Transformer Engine); priced at bf16")
ASYNC_TP = ("", "+", "async TP overlaps the TP collectives we count exposed")
LLAMA3_VIRTUAL = (
    LLAMA3 + " and §3.3.2: an interleaved schedule with V stages a rank, bubble (PP - 1)/(V·M); V is not printed, "
    "but one layer moved off the first stage leaves its first chunk 'only the embedding' (and the last stage's last "
    "chunk only the head), so a chunk is one layer and V = (126 layers + 2)/16 ranks = 8.  Our split "
    "(``parallel.stage_layers``) leaves the last two chunks without a block instead of the first and last: the "
    "busiest rank's 8 blocks, so its time, are the same"
)
LLAMA3_ASYNC_P2P = ("", "+", "asynchronous point-to-point in PP (§3.3.2) overlaps the sends we count exposed")
LLAMA3_NO_CHECKPOINT = (
    "none (§3.3.2: 'we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing')"
)
TT_VIRTUAL = (
    "torchtitan 9dec370 torchtitan/parallelisms/pipelining_utils.py generate_split_points: 2 stages per rank for a "
    "multi-stage schedule given no split points (the benchmark gives none)"
)
CP_CAUSE = (
    "context parallel: priced beside data parallel and TP with or without sequence and vocab parallel "
    "(parallelisms.cp); beside PP, no prediction"
)
CP = ("cp", "", CP_CAUSE)
A100_WORDS = (
    "A100: no A100 calibration; priced on the H100's scaled by the dense bf16 peak (312 / 989.4 TFLOP/s) and the "
    "HBM bandwidth (2.039 / 3.35 TB/s): this row measures that rule"
)
A100 = ("", "", A100_WORDS)
NEMO_WORDS = (
    "Megatron overlaps TP collectives with GEMMs (tp-comm-overlap) and the gradient reduction with the backward"
)
NEMO_OVERLAP = ("", "+", NEMO_WORDS)


@dataclass(frozen=True)
class Run:
    name: str
    source: str  # file or paper, and its table
    model: str  # a preset
    gpu: str  # priced on (``gpus``): h100-80gb, h200 (its own calibration), or a100-80gb (the H100's, scaled)
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
    checkpoint: str  # ours: none | full | selective | op (torchtitan's per-op SAC, "selective (op)")
    published_checkpoint: str
    published: float
    unit: str  # tokens/s/GPU | TFLOP/s/GPU
    convention: str  # how the published figure counts FLOPs (TFLOP/s) or tokens
    differences: tuple[tuple[str, str, str], ...] = ()
    overrides: tuple[tuple[str, Any], ...] = ()  # the run's model where it is not the preset
    virtual_stages: int = 1  # interleaved 1F1B's chunks per pipeline rank, as the source states (``virtual_source``)
    virtual_source: str = ""
    impl: str = "course"  # the program priced (``ops``: course, or llm-foundry for its MPT benchmarks)
    precision: str = "amp-bf16"  # the compute's: bf16 where FSDP gathers bf16 parameters (MixedPrecision)

    @property
    def flags(self) -> set[str]:
        return {f for f, _, _ in self.differences if f}

    @property
    def layout(self) -> ParallelLayout:
        k = self.global_batch // self.dp // self.micro_batch
        return ParallelLayout(dp=self.dp, zero=self.zero if self.dp > 1 else 0, tp=self.tp,
                              sequence_parallel=self.tp > 1, vocab_parallel=self.tp > 1, pp=self.pp,
                              micro_batches=k, virtual_stages=self.virtual_stages,
                              cp=self.cp if self.cp_priced else 1)  # fmt: skip

    @property
    def cp_priced(self) -> bool:
        """Context parallel is priced beside data parallel and TP (with the runs' sequence and vocab parallel), not
        beside PP, which ``parallelisms.cp`` refuses."""
        return self.cp > 1 and self.pp == 1


def _tt(name, gpus, dp, tp, pp, seq, b, gbs, ck, pck, tps, diffs, model="llama-3.1-8b", source=TT_2412, cp=1, v=1):
    return Run(name, source, model, CALIBRATED, "H100 HBM2e 96 GB, 500 W (Grand Teton)", gpus, dp, 3, tp, pp, cp,
               seq, b, gbs, ck, pck, tps, "tokens/s/GPU", "TPS/GPU read at step 90" if source == TT_2412 else "tokens/sec per GPU", (POWER, *diffs),
               virtual_stages=v, virtual_source=TT_VIRTUAL if v > 1 else "")  # fmt: skip


def _trainy(w: int, tps: float) -> Run:
    return Run(f"Trainy 8B FSDP {w} H200", TT_H200, "llama-3.1-8b", "h200", "H200 (8 a host, CX-7 400 Gb/s per GPU)",
               w, w, 3, 1, 1, 1, 8192, 2, 2 * w, "op", "selective (op)", tps, "tokens/s/GPU",
               "TPS/GPU sampled at the 100th iteration", (COMPILE, FLOAT8))  # fmt: skip


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
    _tt("TT T1 8B FSDP 8", 8, 8, 1, 1, 8192, 2, 16, "op", "selective (op)", 5762, ()),
    _tt("TT T1 8B FSDP 8 + compile", 8, 8, 1, 1, 8192, 2, 16, "op", "selective (op)", 6667, (COMPILE,)),
    _tt("TT T1 8B FSDP 8 + compile + Float8", 8, 8, 1, 1, 8192, 2, 16, "op", "selective (op)", 8532,
        (COMPILE, FLOAT8)),
    _tt("TT T3 8B FSDP 128", 128, 128, 1, 1, 8192, 2, 256, "op", "selective (op)", 5605, ()),
    _tt("TT T3 8B FSDP 128 + compile", 128, 128, 1, 1, 8192, 2, 256, "op", "selective (op)", 6514,
        (COMPILE,)),
    _tt("TT T3 8B FSDP 128 + compile + Float8", 128, 128, 1, 1, 8192, 2, 256, "op", "selective (op)", 8380,
        (COMPILE, FLOAT8)),
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
        (COMPILE, FLOAT8, ASYNC_TP), model="llama-3.1-405b", v=2),
    # torchtitan async TP, 2025-06: bf16 rows (vanilla and async TP), torch.compile on
    _tt("TT async-TP 70B FSDP 32 TP 8, bf16", 256, 32, 8, 1, 8192, 16, 512, "full", "full", 597.3, (COMPILE,),
        model="llama-3.1-70b", source=TT_ASYNC),
    _tt("TT async-TP 70B FSDP 32 TP 8, bf16 + async TP", 256, 32, 8, 1, 8192, 16, 512, "full", "full", 652.4,
        (COMPILE, ASYNC_TP), model="llama-3.1-70b", source=TT_ASYNC),
    _tt("TT async-TP 8B FSDP 8 TP 8, bf16", 64, 8, 8, 1, 8192, 12, 96, "op", "selective (op)", 4378,
        (COMPILE,), source=TT_ASYNC),
    _tt("TT async-TP 8B FSDP 8 TP 8, bf16 + async TP", 64, 8, 8, 1, 8192, 12, 96, "op", "selective (op)",
        4809.4, (COMPILE, ASYNC_TP), source=TT_ASYNC),
    # torchtitan docs/performance.md (2024): 405B on 128 H100 (95 GB, lower TDP), FSDP 16 × TP 8, local batch 2
    Run("TT perf 405B FSDP 16 TP 8", TT_PERF + " (Llama 3.1 table, row 'None')", "llama-3.1-405b", CALIBRATED,
        "H100 HBM2e 95 GB, lower TDP", 128, 16, 3, 8, 1, 1, 8192, 2, 32, "full", "full", 109, "tokens/s/GPU",
        "WPS (MFU 29.0 % published beside it); torch.compile not stated", (POWER,)),
    # torchtitan docs/performance.md (2024): 64 A100 80GB, FSDP 64, local batch 1
    Run("TT perf 8B FSDP 64 A100", TT_PERF + " (Llama 3 table, 'selective op')", "llama-3-8b", "a100-80gb",
        "A100 80GB", 64, 64, 3, 1, 1, 1, 8192, 1, 64, "op", "selective (op)", 2973, "tokens/s/GPU",
        "WPS (MFU 58.2 % published beside it)", (A100,)),
    Run("TT perf 70B FSDP 64 A100", TT_PERF + " (Llama 3 table, '70B full')", "llama-3.1-70b", "a100-80gb",
        "A100 80GB", 64, 64, 3, 1, 1, 1, 8192, 1, 64, "full", "full", 331, "tokens/s/GPU",
        "WPS (MFU 51.7 % published beside it)", (A100,)),
    # Trainy on WhiteFiber (torchtitan benchmarks/, 2025-06): 8B on 4 and 8 hosts of 8 H200, 400 Gb/s per GPU
    _trainy(32, 10938),
    _trainy(64, 10753),
    # The Llama 3 paper, Table 4 (16M tokens a step; micro-batch 1 taken: the table gives batch size per DP rank)
    Run("Llama 3 405B 8,192 GPUs TP 8 PP 16 DP 64", LLAMA3 + ", row 1", "llama-3.1-405b", CALIBRATED,
        "H100 80GB HBM3, 700 W", 8192, 64, 2, 8, 16, 1, 8192, 1, 2048, "none", LLAMA3_NO_CHECKPOINT, 430,
        "TFLOP/s/GPU", META_TFLOPS, (LLAMA3_ASYNC_P2P,), virtual_stages=8, virtual_source=LLAMA3_VIRTUAL),
    Run("Llama 3 405B 16,384 GPUs TP 8 PP 16 DP 128", LLAMA3 + ", row 2", "llama-3.1-405b", CALIBRATED,
        "H100 80GB HBM3, 700 W", 16384, 128, 2, 8, 16, 1, 8192, 1, 2048, "none", LLAMA3_NO_CHECKPOINT, 400,
        "TFLOP/s/GPU", META_TFLOPS, (LLAMA3_ASYNC_P2P,), virtual_stages=8, virtual_source=LLAMA3_VIRTUAL),
    Run("Llama 3 405B 16,384 GPUs TP 8 CP 16 PP 16 DP 8", LLAMA3 + ", row 3", "llama-3.1-405b", CALIBRATED,
        "H100 80GB HBM3, 700 W", 16384, 8, 2, 8, 16, 16, 131072, 1, 128, "full", "not stated (full taken)", 380,
        "TFLOP/s/GPU", META_TFLOPS, (LLAMA3_ASYNC_P2P, CP), virtual_stages=8, virtual_source=LLAMA3_VIRTUAL),
    # NVIDIA NeMo 24.07, DGX-H100, FP8 (Transformer Engine), distributed optimizer, MBS 1
    Run("NeMo LLAMA2-7B 8 GPUs", NEMO_2407, "llama-3-8b", CALIBRATED, "DGX-H100", 8, 8, 1, 1, 1, 1, 4096, 1, 128,
        "none", "not stated (none taken)", 16847, "tokens/s/GPU", NEMO, (FP8, NEMO_OVERLAP), LLAMA2_7B),
    Run("NeMo LLAMA2-13B 16 GPUs PP 4 VP 10", NEMO_2407, "llama-3-8b", CALIBRATED, "DGX-H100", 16, 4, 1, 1, 4, 1,
        4096, 1, 128, "none", "not stated (none taken)", 8646, "tokens/s/GPU", NEMO, (FP8, NEMO_OVERLAP), LLAMA2_13B,
        virtual_stages=10, virtual_source=NEMO_2407 + ", column VP"),
    Run("NeMo LLAMA2-70B 64 GPUs TP 4 PP 4 VP 20", NEMO_2407, "llama-3.1-70b", CALIBRATED, "DGX-H100", 64, 4, 1, 4,
        4, 1, 4096, 1, 128, "none", "not stated (none taken)", 1707, "tokens/s/GPU", NEMO,
        (FP8, NEMO_OVERLAP), LLAMA2_70B, virtual_stages=20, virtual_source=NEMO_2407 + ", column VP"),
    Run("NeMo LLAMA3-8B 8 GPUs CP 2", NEMO_2407, "llama-3-8b", CALIBRATED, "DGX-H100", 8, 4, 1, 1, 1, 2, 8192, 1, 128,
        "none", "not stated (none taken)", 12036, "tokens/s/GPU", NEMO, (FP8, NEMO_OVERLAP, CP)),
)  # fmt: skip
"""The runs (see each ``source``).  Llama-2 is not a preset: Llama-3-8B's preset with Llama-2's config.json
sizes (vocabulary 32,000; 7B: 32 KV heads, intermediate 11,008; 13B: 40 layers, hidden 5,120, 40 heads, 40 KV
heads, intermediate 13,824; 70B: Llama-3.1-70B's sizes, vocabulary 32,000)."""


MPT_SOURCE = (
    "https://github.com/mosaicml/llm-foundry/blob/061f2c7ce64e655100286584a7629e2a09f827ba/scripts/train/"
    "benchmarking/README.md, table 'H100 80GB BF16' (Composer FSDP FULL_SHARD, amp_bf16)"
)
MPT_SIZES = {"760m": (1536, 12, 24), "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
             "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}  # fmt: skip
"""(d_model, n_heads, n_layers) of llm-foundry's MPT benchmark models (scripts/train/yamls/pretrain/mpt-*.yaml);
with GPT-2's architecture (LayerNorm and linear biases, a 4·d GELU MLP, learned positions up to the sequence, tied
LM head) and a 50,368 vocabulary, our parameter count equals the table's NumParams on every row
(tests/test_published_runs.py)."""
MPT_SETUP = (
    "https://github.com/mosaicml/llm-foundry/blob/061f2c7ce64e655100286584a7629e2a09f827ba/scripts/train/"
    "benchmarking/ (sweep.sh: the H100 rows' image mosaicml/pytorch:2.0.1_cu118, submit_benchmarks.py's defaults: "
    "attn_impl triton, norm_type low_precision_layernorm, fsdp mixed_precision DEFAULT)"
)
MPT_TRITON = (
    "",
    "-",
    (
        "llm-foundry's Triton FlashAttention (attn_impl: triton; flash-attn's flash_attn_triton.py, tested on A100 "
        "only, on the pre-MLIR Triton patched for sm90: setup.py's triton-pre-mlir@...triton_pre_mlir_sm90) priced "
        "at the published lower bound of its time, 1.7x torch's flash kernel "
        "(step_time.TRITON_FLASH_SLOWDOWN: Dao 2023 §4.1 and the kernel's docstring, A100; no H100 figure exists): "
        "it may be slower still"
    ),
)
MPT_STACK = (
    "",
    "-",
    (
        "the 2023 stack: torch 2.0.1 with CUDA 11.8's cuBLAS and NCCL on Hopper and Composer 0.16's FSDP1 "
        "(FULL_SHARD, MixedPrecision DEFAULT: bf16 all-gathers; every micro-batch's unsharded gradients cast to fp32 "
        "and reduce-scattered in fp32, as Composer syncs FSDP on each), priced on a calibration measured with torch "
        "2.11 and CUDA 13.0 (calibration/h100-80gb/env.json) and plan's FSDP2 collectives in bf16"
    ),
)
MPT_H100 = (  # model, S, GPUs, micro-batch, global batch, activation checkpointing, T/s/GPU, MFU %, NumParams
    ("70b", 2048, 64, 8, 2048, True, 1039, 42.57, 64862437376),
    ("70b", 2048, 32, 2, 1024, True, 882, 36.15, 64862437376),
    ("30b", 8192, 8, 1, 168, True, 1384, 29.92, 30019254272),
    ("30b", 4096, 8, 1, 168, True, 1802, 35.86, 29989894144),
    ("30b", 2048, 32, 14, 1344, True, 2308, 43.92, 29975214080),
    ("30b", 2048, 16, 10, 480, True, 2263, 43.07, 29975214080),
    ("30b", 2048, 8, 3, 504, True, 2002, 38.11, 29975214080),
    ("30b", 1024, 8, 6, 1008, True, 2084, 38.76, 29967874048),
    ("13b", 32768, 8, 1, 24, True, 1976, 31.68, 13011240960),
    ("13b", 16384, 8, 3, 72, True, 2985, 35.55, 12927354880),
    ("13b", 4096, 8, 10, 240, True, 4717, 41.6, 12864440320),
    ("13b", 2048, 64, 2, 128, False, 4800, 39.86, 12853954560),
    ("13b", 2048, 32, 2, 64, False, 4811, 39.95, 12853954560),
    ("13b", 2048, 16, 2, 32, False, 4767, 39.58, 12853954560),
    ("13b", 2048, 8, 2, 16, False, 4792, 39.79, 12853954560),
    ("13b", 1024, 8, 40, 960, True, 5502, 44.27, 12848711680),
    ("7b", 65536, 8, 1, 16, True, 1956, 28.59, 6918905856),
    ("7b", 32768, 8, 2, 32, True, 3318, 30.94, 6784688128),
    ("7b", 8192, 8, 8, 128, True, 6935, 37.14, 6684024832),
    ("7b", 4096, 8, 16, 256, True, 8611, 40.42, 6667247616),
    ("7b", 2048, 8, 6, 48, False, 10643, 46.44, 6658859008),
    ("7b", 1024, 8, 64, 1024, True, 10203, 42.83, 6654664704),
    ("3b", 65536, 8, 1, 16, True, 3262, 26.81, 2814366720),
    ("3b", 32768, 8, 3, 144, True, 5873, 28.84, 2730480640),
    ("3b", 16384, 8, 1, 48, False, 11152, 36.34, 2688537600),
    ("3b", 8192, 8, 3, 144, False, 16578, 40.31, 2667566080),
    ("3b", 4096, 8, 5, 240, False, 20964, 42.31, 2657080320),
    ("3b", 2048, 64, 6, 1152, False, 22525, 40.8, 2651837440),
    ("3b", 2048, 32, 6, 576, False, 23021, 41.7, 2651837440),
    ("3b", 2048, 16, 10, 480, False, 24142, 43.73, 2651837440),
    ("3b", 1024, 8, 20, 960, False, 27046, 46.2, 2649216000),
    ("3b", 512, 8, 40, 1920, False, 27965, 46.32, 2647905280),
    ("1b", 65536, 8, 1, 16, True, 5506, 26.34, 1445974016),
    ("1b", 32768, 8, 1, 32, False, 12025, 33.54, 1378865152),
    ("1b", 16384, 8, 2, 64, False, 19649, 35.22, 1345310720),
    ("1b", 8192, 8, 3, 96, False, 29157, 37.73, 1328533504),
    ("1b", 4096, 8, 7, 224, False, 38535, 40.26, 1320144896),
    ("1b", 2048, 64, 20, 1280, False, 44402, 40.85, 1315950592),
    ("1b", 2048, 32, 20, 640, False, 45130, 41.52, 1315950592),
    ("1b", 2048, 16, 20, 320, False, 46037, 42.36, 1315950592),
    ("1b", 2048, 8, 14, 112, False, 45455, 41.82, 1315950592),
    ("1b", 1024, 8, 18, 576, False, 48910, 41.95, 1313853440),
    ("1b", 512, 8, 56, 1792, False, 52275, 43.21, 1312804864),
    ("760m", 32768, 8, 1, 16, False, 16291, 31.84, 807656448),
    ("760m", 16384, 8, 3, 48, False, 27815, 33.57, 782490624),
    ("760m", 8192, 8, 6, 96, False, 41825, 34.84, 769907712),
    ("760m", 4096, 8, 12, 192, False, 55459, 35.83, 763616256),
    ("760m", 2048, 32, 24, 768, False, 67971, 37.57, 760470528),
    ("760m", 2048, 16, 24, 384, False, 68551, 37.89, 760470528),
    ("760m", 2048, 8, 24, 384, False, 63147, 34.9, 760470528),
    ("760m", 1024, 8, 48, 768, False, 78581, 39.76, 758897664),
    ("760m", 512, 8, 96, 1536, False, 83749, 40.42, 758111232),
)  # fmt: skip


def _mpt(model, seq, gpus, b, gbs, ck, tps, _mfu, _n) -> Run:
    d, h, layers = MPT_SIZES[model]
    sizes = (("vocab_size", 50368), ("d_model", d), ("num_heads", h), ("num_layers", layers), ("d_ff", 4 * d),
             ("context_length", seq), ("max_position_embeddings", seq))  # fmt: skip
    return Run(f"MPT {model} S {seq:,} {gpus} GPUs", MPT_SOURCE + "; setup: " + MPT_SETUP, "openai-gpt2", CALIBRATED,
               "H100 80GB", gpus, gpus, 3, 1, 1, 1, seq, b, gbs, "full" if ck else "none", "full" if ck else "none",
               tps, "tokens/s/GPU", MPT_CONVENTION, (MPT_TRITON, MPT_STACK), sizes, impl="llm-foundry",
               precision="bf16")  # fmt: skip


MPT_CONVENTION = (
    "Throughput (T/s/GPU); its MFU column is the same figure times (6·N + 12·l·d·S) / 989.4 TFLOP/s "
    "(collect_results.py; tests/test_published_runs.py)"
)
RUNS += tuple(_mpt(*r) for r in MPT_H100)


def config(run: Run):
    cfg = load_config(run.model)
    return dataclasses.replace(cfg, **dict(run.overrides)) if run.overrides else cfg


def setup(run: Run) -> TrainingSetup:
    return TrainingSetup(attention="sdpa", checkpoint=run.checkpoint, precision=run.precision)


def estimate(run: Run) -> StepEstimate:
    """Rule step 1: the run's own layout on ``plan``'s step-time model."""
    return estimate_step(config(run), run.gpu, run.seq, run.micro_batch, setup(run), run.layout, impl=run.impl)


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
        "priced_on": run.gpu, "gpus": run.gpus, "layout": f"{lay.label}" + (f"·cp{run.cp}" if run.cp > 1 and not run.cp_priced else ""),
        "seq": run.seq, "micro_batch": run.micro_batch, "micro_batches": lay.micro_batches,
        "global_batch": run.global_batch, "checkpoint": run.checkpoint, "published_checkpoint": run.published_checkpoint,
        "published": run.published, "unit": run.unit, "convention": run.convention,
        "published_tokens_per_s": published_tokens_per_s(run),
    }  # fmt: skip
    predicted = None
    if "cp" not in run.flags or run.cp_priced:
        e = estimate(run)
        step, times, (gemm, attention, other, bubble) = e.step_seconds, e.times, e.parts
        predicted = run.global_batch * run.seq / step / run.gpus
        busy = gemm + attention + other  # the compute less the bubble
        row.update(u=e.hfu, attention_share=attention / busy, memory_bound_share=other / busy, step_s=step,
                   compute_s=times[0], dp_comm_s=times[1], tp_comm_s=times[2], pp_comm_s=times[3])  # fmt: skip
        row["bubble"] = bubble / times[0]
    else:
        row.update({k: None for k in PREDICTED})
    row["predicted_tokens_per_s"] = predicted
    error = None if predicted is None else predicted / row["published_tokens_per_s"] - 1
    row["error"] = error
    out = sorted(run.flags & set(EXCLUDE) - ({"cp"} if run.cp_priced else set()))  # a priced CP row counts
    row["in_summary"] = not out
    row["excluded_because"] = ", ".join(out)
    row["differences"] = "; ".join(f"({d or '?'}) {w}" for _, d, w in run.differences)
    row["cause"] = cause(run, row)
    row["source"] = run.source + (
        f"; {lay.virtual_stages} virtual stages: {run.virtual_source}" if run.virtual_source else ""
    )
    return row


PREDICTED = ("u", "attention_share", "memory_bound_share", "step_s", "compute_s", "dp_comm_s", "tp_comm_s",
             "pp_comm_s", "bubble")  # fmt: skip
SHARE = 0.20  # a term of the predicted step named in a cause from this share on (``cause``)


def cause(run: Run, row: dict[str, Any]) -> str:
    """Where |error| > 10 %: the run's differences acting in the error's direction ("-": we over-predict, "+": we
    under-predict), then the terms of our prediction that could carry the error, from ``SHARE`` of it on.  Over-
    predicted: the fused attention's share of the calibrated compute (priced at the calibration's torch flash
    kernel, or llm-foundry's Triton kernel at its bound), data-parallel collectives from a tenth of the compute
    (counted overlapped).  Under-predicted: the memory-bound kernels' share (each priced as a kernel of its own; a
    fusing stack runs fewer), the TP collectives counted exposed, the 1F1B bubble, the pipeline's sends counted
    exposed, data-parallel collectives longer than the compute (all-gathers of the fp32 parameters over ``plan``'s
    links)."""
    error = row["error"]
    if error is None:
        return "not predicted: " + "; ".join(w for f, _, w in run.differences if f == "cp")
    if abs(error) <= 0.10:
        return ""
    sign = "-" if error > 0 else "+"
    parts = [w for _, d, w in run.differences if d == sign]
    step, compute = row["step_s"], row["compute_s"]
    if error > 0 and row["attention_share"] >= SHARE:
        parts.append(
            f"fused attention {100 * row['attention_share']:.0f} % of the calibrated compute (priced at "
            + (f"{TRITON_FLASH_SLOWDOWN}x " if run.impl == "llm-foundry" else "")
            + "the calibration's torch flash kernel)"
        )
    if error > 0 and row["dp_comm_s"] >= SHARE / 2 * compute:
        parts.append(
            f"data-parallel collectives {100 * row['dp_comm_s'] / compute:.0f} % of the compute, counted hidden "
            "behind it"
        )
    if error < 0 and row["memory_bound_share"] >= SHARE:
        parts.append(f"memory-bound kernels {100 * row['memory_bound_share']:.0f} % of the calibrated compute")
    if error < 0 and row["tp_comm_s"] / step >= SHARE / 2:
        parts.append(f"TP collectives counted exposed: {100 * row['tp_comm_s'] / step:.0f} % of the step")
    if error < 0 and row["bubble"] >= SHARE / 2:
        parts.append(f"1F1B bubble {100 * row['bubble']:.0f} % of the compute")
    if error < 0 and row["pp_comm_s"] / step >= SHARE / 2:  # v-fold under an interleaved schedule
        parts.append(f"pipeline sends counted exposed: {100 * row['pp_comm_s'] / step:.0f} % of the step")
    if error < 0 and row["dp_comm_s"] > compute:
        link = (
            "NVLink"
            if run.gpus <= GPUS_PER_NODE
            else f"rings over {DEFAULT_INTERNODE // 10**9} GB/s NICs between nodes"
        )
        parts.append(f"data-parallel collectives ({link}) {row['dp_comm_s']:.2f} s exceed the compute {compute:.2f} s")
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
