"""What the printed labels claim was measured, and where: one record per validation, as data.

Views print these phrases instead of prose of their own, so a label cannot go stale when a new run
lands: ``tests/test_provenance.py`` recounts every figure here from the committed tables
(``reports/cuda/env.json`` and its CSVs) and fails when they disagree.  No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_TORCH = "2.13"
"""The torch whose CPU kernels and storage tracker the meta and CPU proofs run on (the test suite's)."""


@dataclass(frozen=True)
class GpuRun:
    """One committed GPU validation (``reports/cuda/``): the machine, and per section how many of its
    figures equal the prediction."""

    gpu: str  # env.json "gpu"
    torch: str  # env.json "torch"
    date: str  # env.json "date"
    equal: dict[str, tuple[int, int]]  # section (CSV stem) -> (figures equal, figures compared)
    program_equal: tuple[int, int] = (0, 0)  # memory.csv's figures the op library's course program equals
    folder: str = "reports/cuda"

    @property
    def where(self) -> str:
        return f"{self.gpu} with torch {self.torch}"

    def to_dict(self, section: str) -> dict[str, object]:
        """The JSON form of one section's claim (what ``phrase`` prints)."""
        equal, total = self.equal[section]
        where = f"{self.folder}/{section}.csv"
        return {"gpu": self.gpu, "torch": self.torch, "equal": equal, "compared": total, "table": where}

    def phrase(self, section: str, what: str = "figures") -> str:
        """'measured on NVIDIA H200 with torch 2.11.0+cu130: 1,623 of 1,624 figures equal, reports/cuda/memory.csv'."""
        equal, total = self.equal[section]
        return f"measured on {self.where}: {equal:,} of {total:,} {what} equal, {self.folder}/{section}.csv"

    def program_phrase(self) -> str:
        """The op library's course program (analytic/ops) against the same memory figures (tests/test_ops_cuda.py
        replays every row)."""
        equal, total = self.program_equal
        return f"measured on {self.where}: {equal:,} of {total:,} figures equal, reports/cuda/memory.csv"


CUDA = GpuRun(
    gpu="NVIDIA H200",
    torch="2.11.0+cu130",
    date="2026-11-26",
    equal={
        # 232 runs x 7 figures (baseline, forward/backward/step peak and end): the legacy replay's 174 (1,217 of
        # 1,218), and 58 of --checkpoint op (2026-11-28), the op library's course program (the replay lacks it)
        "memory": (1623, 1624),
        "parallel": (588, 588),  # 84 ranks x 7 figures (12 of them FSDP2 under --checkpoint op, 2026-11-28)
        "flops": (59, 59),  # points with every count (analytic, fvcore, FlopCounterMode) equal
        "inference": (36, 42),  # the 6 others: decode peaks 16-64 KiB above the prediction
    },
    program_equal=(1624, 1624),
)
"""The H200 validation of stop 23 (``benchmarks/cuda_run.sh``).  ``equal["memory"]`` counts the committed
predicted columns, the legacy replay's (analytic/replay.py, ``--repredict``)."""

CUDA_H100 = GpuRun(
    gpu="NVIDIA H100 80GB HBM3",
    torch="2.11.0+cu130",
    date="2026-11-27",
    equal={
        "memory": (1140, 1141),  # our model: 163 runs x 7 (the run stopped at its limit after 184 of 198 rows)
        # transformers' own models: 89 runs x 7 at stop 33 (less the harness's 4-byte tensor), 340 runs x 7 at stop 39
        "hf_memory": (3003, 3003),
    },
    folder="reports/cuda-h100",
)
"""The H100 validations of stops 33 and 39 (``benchmarks/cuda_calibrate_run.sh``): our model again, and
transformers' own classes against the op library's transformers programs on the cuda target."""

CUDA_H200 = GpuRun(
    gpu="NVIDIA H200",
    torch="2.11.0+cu130",
    date="2026-11-27",
    equal={"hf_memory": (2856, 2856)},  # transformers' own models: 408 runs x 7
    folder="reports/cuda-h200",
)
"""The H200 validation of stop 37 (``benchmarks/cuda_calibrate_run.sh`` and ``--models``): transformers' own classes,
35 families, against the op library's transformers programs on the cuda target."""

_DENSE = ("llama", "mistral", "qwen3", "gpt2", "gemma3_text", "olmo2", "phi3")
_ZOO = (
    *("olmo3", "ministral", "gemma", "hunyuan_v1_dense", "granite", "cohere", "cohere2", "gpt_neox", "phi", "gptj"),
    *("smollm3", "starcoder2", "exaone4", "helium", "ernie4_5", "glm", "glm4", "ministral3", "hyperclovax", "olmo"),
    *("seed_oss", "stablelm"),
)
_H100_ZOO = (  # stop 39's lease: the programs added without a GPU (BLOOM and gpt-oss are eager only)
    *("qwen2", "exaone", "internlm3", "iquestcoder", "nemotron", "opt", "falcon", "gpt_bigcode", "youtu", "olmoe"),
    *("phimoe", "granitemoe", "granitemoeshared", "qwen2_moe", "minimax_m2", "hy_v3", "hunyuan_v1_moe", "glm4_moe"),
    *("ernie4_5_moe", "sarvam_mla", "glm4_moe_lite"),
    # the recurrent hybrids' PyTorch paths (no mamba_ssm, causal_conv1d or fla installed)
    *("nemotron_h", "bamba", "granitemoehybrid", "falcon_h1", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"),
)
HF_CUDA_RUNS = (
    (
        CUDA_H200,
        {
            "naive": frozenset(
                {*_DENSE, *_ZOO, "gemma2", "vaultgemma", "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
            ),
            "sdpa": frozenset({*_DENSE, *_ZOO, "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3"}),
        },
    ),
    (
        CUDA_H100,
        {
            "naive": frozenset({*_DENSE, *_H100_ZOO, "gemma2", "bloom", "gpt_oss"}),
            "sdpa": frozenset({*_DENSE, *_H100_ZOO}),
        },
    ),
)
"""Per GPU run, newest first: transformers' model types (``hf_model_type``) whose training steps it measured on CUDA,
per attention (its hf_memory.csv), in fp32, bf16 and amp-bf16, with and without full checkpointing: eager attention
for every family; sdpa for all but Gemma 2, VaultGemma, BLOOM and gpt-oss (transformers runs them eager only), and
not amp-bf16 for Nemotron and ERNIE 4.5-MoE (refused): cuDNN attention (16-bit, its bias for
a sliding window, its own dropout for GPT-2, DeepSeek's value head unlike its query/key head), the memory-efficient
kernel (fp32, heads equal or repeated for a window) and the math path (fp32 with grouped K/V heads)."""


def hf_cuda_run(model_type: str | None, attention: str) -> GpuRun | None:
    """The newest GPU run that measured transformers' ``model_type`` with ``attention`` (``HF_CUDA_RUNS``)."""
    return next((run for run, kinds in HF_CUDA_RUNS if model_type in kinds.get(attention, ())), None)


MEASURED_MODELS = ("gpt2-small", "llama-3-8b", "qwen3-0.6b", "qwen3-30b-a3b")
"""The presets (at reduced shapes) whose training steps the GPU measured (reports/cuda/memory.csv): the course
model's Llama-like block (pre-RMSNorm, SwiGLU, RoPE, grouped K/V heads, per-head qk-norm, tied embeddings) and its
mixture of experts (Qwen3-MoE).  No other architecture ran on a GPU."""

KERNEL_FACT_GPUS = {
    "h200": "NVIDIA H200, where the kernel facts were measured",
    "h100-80gb": "NVIDIA H100 SXM: the H200's Hopper kernels and 132 multiprocessors",
}
"""The GPUs (``gpus.GPUS`` names) whose CUDA kernels and multiprocessor count are the measured ones
(``analytic.cuda_kernels``: flash attention through torch's sdpa, ``SMS`` = 132)."""
