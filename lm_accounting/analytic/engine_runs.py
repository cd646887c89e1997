"""Published vLLM start-ups beside ``engine_sizing``'s prediction: the error and its cause, row by row.

Each run is a public log quoted verbatim in ``quote``.  Two kinds of row:

* ``predicted``: we predict the KV cache memory from the GPU's CUDA total (the run's own, as its log
  prints it), the weights, our activation estimate and the default non-torch memory, then the blocks,
  tokens and concurrency from it.  The error is in the activation peak and non-torch memory, which vLLM
  measures (``engine_sizing`` module docstring, 4 and 5).
* ``arithmetic``: the log's KV cache memory is given (``--kv-cache-memory``), so only the page, block,
  token and concurrency arithmetic is checked.  The log prints GiB to two decimals, so the blocks can
  differ by the rounding: ±0.005 GiB is ±2 blocks of 2 MiB.

No torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..config import load_config
from ..gpus import GIB, gpu
from .engine_sizing import SglangOptions, VllmOptions, sglang_sizing, vllm_sizing


@dataclass(frozen=True)
class Run:
    name: str
    model: str  # a preset
    overrides: tuple[tuple[str, Any], ...]  # fields of the served model that differ from the preset
    gpu: str
    total_gib: str  # the CUDA total the log prints
    options: VllmOptions | SglangOptions
    kind: str  # predicted | arithmetic
    published: dict[str, float]  # weights_gib, kv_gib, tokens, concurrency: what the log prints
    version: str
    source: str
    quote: str
    tp: int = 1
    weights: str = "bf16"


def _gib(text: str) -> int:
    return int(Fraction(text) * GIB)


RUNS = (
    Run(
        "Llama-3.1-8B-Instruct, A100 40GB",
        "llama-3.1-8b",
        (),
        "a100-40gb",
        "39.38",
        VllmOptions(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=256),
        "predicted",
        {"weights_gib": 14.99, "kv_gib": 19.28, "tokens": 157_936, "concurrency": 1.20},
        "vLLM 0.15.1 (LLM class, enforce_eager)",
        "https://github.com/ilseokoh/vllm-gce (README.md)",
        "Model loading took 14.99 GiB memory; Available KV cache memory: 19.28 GiB; GPU KV cache size: 157,936 "
        "tokens; Maximum concurrency for 131,072 tokens per request: 1.20x",
    ),
    Run(
        "Meta-Llama-3-8B, H100 80GB",
        "llama-3-8b",
        (),
        "h100-80gb",
        "79.22",
        VllmOptions(max_model_len=8192, max_num_batched_tokens=8192, max_num_seqs=256),
        "predicted",
        {"weights_gib": 14.96, "kv_gib": 53.29},
        "vLLM V0 engine (PR #10511, 2024-12)",
        "https://github.com/vllm-project/vllm/pull/10511",
        "total_gpu_memory 79.22GiB x gpu_memory_utilization 0.90 = 71.29GiB; model weights take 14.96GiB; "
        "non_torch_memory 1.79GiB; PyTorch activation peak memory 1.26GiB; available_kv_cache_memory 53.29GiB",
    ),
    Run(
        "Qwen3-14B, one GPU",
        "qwen3-8b",
        (("num_layers", 40), ("d_model", 5120), ("num_heads", 40), ("d_ff", 17408)),
        "h100-80gb",
        "79.11",
        VllmOptions(max_model_len=32768, kv_cache_memory=_gib("6.51")),
        "arithmetic",
        {"kv_gib": 6.51, "tokens": 42_656, "concurrency": 1.30},
        "vLLM ~0.10/0.11",
        "https://github.com/LMCache/LMCache/issues/1739",
        "Available KV cache memory: 6.51 GiB; GPU KV cache size: 42,656 tokens; Maximum concurrency for 32,768 "
        "tokens per request: 1.30x",
    ),
    Run(
        "llava-v1.6-mistral-7b (its Mistral-7B), H100 80GB",
        "mistral-7b",
        (("sliding_window", None),),
        "h100-80gb",
        "79.19",
        VllmOptions(max_model_len=4096, max_num_batched_tokens=16384, kv_cache_memory=_gib("55.15")),
        "arithmetic",
        {"kv_gib": 55.15, "tokens": 451_744, "concurrency": 110.29},
        "vLLM 0.10.2 (LLM class)",
        "a GitHub-indexed run log (repository not identified)",
        "Model loading took 14.0786 GiB; Available KV cache memory: 55.15 GiB; GPU KV cache size: 451,744 tokens; "
        "Maximum concurrency for 4,096 tokens per request: 110.29x",
    ),
)
QWEN3_235B = (("num_layers", 94), ("d_model", 4096), ("num_heads", 64), ("num_kv_heads", 4), ("head_dim", 128),
              ("num_experts", 128), ("experts_per_token", 8), ("expert_d_ff", 1536))  # fmt: skip
"""Qwen3-235B-A22B's config.json sizes on Qwen3-30B-A3B's preset (the same family: 151,936 vocabulary, qk-norm)."""
QWEN3_235B_QUOTE = (
    "launched Qwen3-235B-A22B-FP8 on both vLLM and SGLang on 4xH100 GPUs. On vLLM: Available KV cache memory: 8.11 "
    "GiB GPU KV cache size: 178,880 tokens. SGLang (--tp 4 --mem-fraction-static 0.93): KV Cache is allocated. "
    "#tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"
)
RUNS += (
    Run(
        "Qwen3-235B-A22B-FP8, 4 H100s (tp 4)", "qwen3-30b-a3b", QWEN3_235B, "h100-80gb", "79.11",
        VllmOptions(max_model_len=40960, kv_cache_memory=_gib("8.11")), "arithmetic",
        {"kv_gib": 8.11, "tokens": 178_880}, "vLLM V1 (with LMCacheConnectorV1)",
        "https://github.com/vllm-project/vllm/issues/21348", QWEN3_235B_QUOTE, tp=4, weights="fp8",
    ),
    Run(
        "Qwen3-235B-A22B-FP8, 4 H100s (tp 4), SGLang", "qwen3-30b-a3b", QWEN3_235B, "h100-80gb", "79.11",
        SglangOptions(Fraction(93, 100)), "predicted", {"tokens": 367_404, "k_gib": 8.23}, "SGLang (2025-07)",
        "https://github.com/vllm-project/vllm/issues/21348", QWEN3_235B_QUOTE, tp=4, weights="fp8",
    ),
)  # fmt: skip
"""Published start-ups (see each ``source``).  Qwen3-14B is not a preset: Qwen3-8B's preset with Qwen3-14B's
config.json sizes (40 layers, hidden 5,120, 40 heads, 8 KV heads of 128, intermediate 17,408)."""


def compare(run: Run) -> dict[str, Any]:
    """One row: the run's published figures beside ours, and the error of each."""
    cfg = load_config(run.model)
    if run.overrides:
        cfg = dataclasses.replace(cfg, **dict(run.overrides))
    g = dataclasses.replace(gpu(run.gpu), cuda_total=_gib(run.total_gib))
    kw = dict(weights=run.weights, kv_dtype="bf16", tp=run.tp, prompt=1, generate=1)
    if isinstance(run.options, SglangOptions):
        s = sglang_sizing(cfg, g, run.options, **kw)
        ours = {"weights_gib": s.weights / GIB, "kv_gib": s.kv_cache_memory / GIB, "tokens": s.kv_cache_tokens,
                "k_gib": s.k_bytes / GIB}  # fmt: skip
    else:
        s = vllm_sizing(cfg, g, run.options, **kw)
        ours = {"weights_gib": s.weights / GIB, "kv_gib": s.kv_cache_memory / GIB, "tokens": s.kv_cache_tokens,
                "concurrency": s.max_concurrency}  # fmt: skip
    row: dict[str, Any] = {"run": run.name, "kind": run.kind, "version": run.version, "total_gib": run.total_gib}
    for key, value in ours.items():
        row[f"{key}_ours"] = value
        published = run.published.get(key)
        row[f"{key}_published"] = published
        row[f"{key}_error"] = None if published is None else value / published - 1
    row["engine"] = "sglang" if isinstance(run.options, SglangOptions) else "vllm"
    row["activation_gib_ours"] = getattr(s, "activation_peak", 0) / GIB
    row["source"], row["quote"] = run.source, run.quote
    return row


def rows() -> list[dict[str, Any]]:
    return [compare(run) for run in RUNS]


# -- serving throughput: TensorRT-LLM's published tables against the roofline ----------------------------------

TRTLLM_SOURCE = (
    "NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (commit 258c7540), 'Throughput Measurements': "
    "trtllm-bench throughput, 'Total Output Throughput (tokens/sec)', requests fed at an infinite rate, "
    "ModelOpt FP8 checkpoints (nvidia/Llama-3.1-*-Instruct-FP8: weights and activations of the blocks' linear "
    "layers in FP8), H100 80GB HBM3"
)
LENGTHS = ((128, 128), (128, 2048), (128, 4096), (500, 2000), (1000, 1000), (1000, 2000), (1024, 2048),
           (2048, 128), (2048, 2048), (5000, 500), (20000, 2000))  # fmt: skip
TRTLLM_H100 = {  # (preset, tp) -> output tokens/s at each of LENGTHS (None: not published)
    ("llama-3.1-8b", 1): (27568.68, 22003.62, 13640.35, 17794.39, 15270.02, 13850.22, 13374.15, 3495.05, 9653.67,
                          3371.16, 1340.92),
    ("llama-3.1-70b", 2): (6183.41, 5822.02, 3714.87, 4704.31, 4191.26, 3920.44, 3896.14, 747.51, 2732.86, 866.77,
                           408.43),
    ("llama-3.1-405b", 8): (3732.40, 4572.23, 2911.42, 3661.85, 2963.36, 3253.17, 3089.16, 448.89, 2139.94, 579.14,
                            370.26),
}  # fmt: skip


def throughput_rows() -> list[dict[str, Any]]:
    """Each published TensorRT-LLM H100 figure beside ``infer``'s throughput bound (the roofline at the largest
    batch that fits, ``inference_report._throughput_bound``) and its calibrated figure (``realistic``), fp8 w8a8
    weights, with an fp8 KV cache and, beside it, a bf16 one.  published / bound is the share of the bound the
    engine reached: above 1, the bound's assumptions are not the run's (with a bf16 cache, several rows are: the
    runs held more sequences than a bf16 cache allows, so their cache was fp8)."""
    from .inference_report import infer

    out = []
    for (model, tp), figures in TRTLLM_H100.items():
        cfg = load_config(model)
        for (isl, osl), published in zip(LENGTHS, figures, strict=True):
            row: dict[str, Any] = {"model": model, "tp": tp, "input": isl, "output": osl,
                                   "published_tokens_per_s": published}  # fmt: skip
            for kv in ("fp8", "bf16"):
                r = infer(cfg, isl, osl, 1, weights="fp8", kv_dtype=kv, tp=tp, gpu="h100-80gb")
                bound = r.roofline["throughput_bound_tokens_per_s"]
                row[f"bound_{kv}_kv"] = bound
                row[f"batch_{kv}_kv"] = r.roofline["throughput_bound_batch"]
                row[f"published_over_bound_{kv}_kv"] = published / bound if bound else None
                if kv == "fp8":
                    real = (r.roofline["realistic"] or {}).get("throughput_tokens_per_s")
                    row["realistic_fp8_kv"] = real
                    row["published_over_realistic"] = published / real if real else None
            out.append(row)
    return out
