"""The one GPU table: memory, HBM bandwidth, dense peak FLOP/s per dtype and the interconnect.

Every figure is an exact int with its source beside it (the vendor's datasheet or whitepaper).
Conventions:

* FLOP/s are **dense** (no 2:4 structured sparsity).  NVIDIA datasheets quote the tensor-core
  figures "with sparsity"; the dense figure is half of that (the Hopper whitepaper lists both).
  ``fp32`` is the non-tensor-core FP32 rate (AMD: the matrix FP32 rate), ``tf32`` FP32 inputs on
  tensor cores, ``bf16``/``fp16`` accumulate in fp32, ``int8`` is TOPS.  A dtype the datasheet
  does not list is absent (the A100 has no fp8).
* ``memory_bytes`` is the datasheet's capacity read as decimal GB (80 GB = 80·10⁹ bytes): what the
  vendor sells.  The HBM stacks hold binary GiB (80 GiB on an H100 80GB).
* ``cuda_total`` is what CUDA reports as the device's total,
  ``torch.cuda.get_device_properties(i).total_memory`` (the driver keeps a little of the stacks: an
  H100 80GB reports 79.11 GiB), from a public record of that figure, cited in ``cuda_total_source``.
  Where no record was found the rule is the datasheet capacity in decimal bytes (``memory_bytes``),
  a lower bound: every CUDA total found is above its card's decimal capacity (79.11 GiB = 84.9 GB
  on an H100 80GB; 23.64 GiB = 25.4 GB on an RTX 4090 24 GB).
* The budget of one GPU (``memory_budget``) is ``cuda_total`` less an allowance for the CUDA context,
  communication buffers and fragmentation (``DEFAULT_ALLOWANCE``), or a ``--budget`` given as is.
* ``bandwidth`` is the peak HBM (or GDDR) bandwidth in bytes/s (decimal TB/s = 10¹² bytes/s).
* ``interconnect_bytes_per_s`` is the datasheet's GPU-to-GPU figure, **bidirectional aggregate**
  per GPU (NVLink "900 GB/s" on an H100 SXM = 450 GB/s each way); ``interconnect`` names the link.
  PCIe-only cards list their PCIe slot's bidirectional figure.

No torch.  ``gpu(name)`` resolves a name or alias (case-insensitive) with a "did you mean" error.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import MappingProxyType

from .config import AccountingError
from .units import fmt_bytes

T = 10**12  # tera: TFLOP/s, TB/s
G = 10**9  # giga: GB, GB/s


@dataclass(frozen=True)
class GPU:
    """One accelerator's datasheet figures (exact ints; see the module docstring)."""

    name: str
    label: str
    memory_bytes: int
    bandwidth: int  # HBM bytes/s
    peak: MappingProxyType  # dtype -> dense FLOP/s (int8: OP/s)
    interconnect: str
    interconnect_bytes_per_s: int  # bidirectional aggregate per GPU
    source: str
    cuda_total: int = 0  # bytes CUDA reports as total (module docstring); set from CUDA_TOTALS
    cuda_total_source: str = ""

    def peak_flops(self, dtype: str) -> int:
        if dtype not in self.peak:
            raise AccountingError(f"GPU '{self.name}' has no '{dtype}' figure (valid: {', '.join(self.peak)})")
        return self.peak[dtype]

    @property
    def interconnect_one_way(self) -> int:
        """Bytes/s each way: half the bidirectional aggregate."""
        return self.interconnect_bytes_per_s // 2


GIB = 2**30

CUDA_TOTALS = {
    # name -> (total_memory in hundredths of a GiB, as torch prints it, source).  torch's out-of-memory
    # message prints the device's total: "GPU 0 has a total capacity of 79.11 GiB"; the figure moves by
    # a few hundredths of a GiB with the driver (79.11 to 79.21 GiB are seen on H100 80GB cards).
    "h100-80gb": (
        7911,
        (
            "torch OOM message on an H100 80GB HBM3, 'total capacity of 79.11 GiB' (vllm-project/vllm#27508); "
            "nvidia-smi shows 81,559 MiB (NVIDIA/nccl#1264, modal-labs/modal-client#2797)"
        ),
    ),
    "h200": (
        13980,
        (
            "torch OOM messages on H200 jobs, 'total capacity of 139.80 GiB', the same figure in 10 public GitHub "
            "files found by exact-string search (2026-11-26; run logs and notes, e.g. SGLang and Megatron jobs); "
            "nvidia-smi shows 143,771 MiB (this project's H200, reports/cuda/env.json)"
        ),
    ),
    "a100-80gb": (
        7925,
        (
            "torch OOM message on an A100 80GB, 'total capacity of 79.25 GiB' (HiDream-ai/VAREdit#6, "
            "levihsu/OOTDiffusion#235); nvidia-smi shows 81,920 MiB (modal-labs/modal-client#2797)"
        ),
    ),
    "a100-40gb": (
        3938,
        (
            "torch OOM messages, 'total capacity of 39.38 GiB', in 9 public GitHub files found by exact-string search "
            "(2026-11-27), the 40 GB A100's figure; vLLM quotes it as 'total_gpu_memory (39.38GiB)' (vllm-project/vllm#16570)"
        ),
    ),
    "rtx-4090": (
        2364,
        "torch OOM message on an RTX 4090, 'total capacity of 23.64 GiB' (3DTopia/Phidias-Diffusion#8)",
    ),
}
"""The CUDA-reported totals found on record; a GPU not here falls back to its decimal capacity."""

FALLBACK = (
    "no public record of the CUDA total found: the datasheet capacity in decimal bytes, a lower bound "
    "(every CUDA total found is above its card's decimal capacity)"
)


def _gpu(name, label, memory, bandwidth, peak, interconnect, link, source) -> GPU:
    centi, where = CUDA_TOTALS.get(name, (None, FALLBACK))
    total = memory if centi is None else centi * GIB // 100
    return GPU(name, label, memory, bandwidth, MappingProxyType(dict(peak)), interconnect, link, source, total, where)


# Tenths of a TFLOP/s as exact ints: 494.7 TFLOP/s = 4947 · 10^11.
_D = 10**11

_A100 = {"fp32": 195 * _D, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T, "int8": 624 * T}
# NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS; TF32 156 (312 sparse); BF16 and
# FP16 312 (624 sparse); INT8 624 TOPS (1,248 sparse).  No FP8.
_H100_SXM = {
    "fp32": 67 * T,
    "tf32": 4947 * _D,
    "bf16": 9894 * _D,
    "fp16": 9894 * _D,
    "fp8": 19789 * _D,
    "int8": 19789 * _D,
}
# NVIDIA H100 datasheet, H100 SXM: FP32 67 TFLOPS; TF32 989, BF16 1,979, FP16 1,979, FP8 3,958,
# INT8 3,958 TOPS, all with sparsity.  Dense figures from the NVIDIA H100 Tensor Core GPU
# Architecture whitepaper (Hopper), table 2: TF32 494.7, BF16/FP16 989.4, FP8 1,978.9, INT8 1,978.9.

GPUS: MappingProxyType = MappingProxyType(
    {
        g.name: g
        for g in (
            _gpu(
                "a100-40gb",
                "NVIDIA A100 40GB SXM",
                40 * G,
                1_555 * G,
                _A100,
                "NVLink 3",
                600 * G,
                # A100 datasheet: 40GB HBM2, 1,555 GB/s (40GB SXM); NVLink 600 GB/s.
                "NVIDIA A100 Tensor Core GPU datasheet",
            ),
            _gpu(
                "a100-80gb",
                "NVIDIA A100 80GB SXM",
                80 * G,
                2_039 * G,
                _A100,
                "NVLink 3",
                600 * G,
                # A100 datasheet: 80GB HBM2e, 2,039 GB/s (80GB SXM); NVLink 600 GB/s.
                "NVIDIA A100 Tensor Core GPU datasheet",
            ),
            _gpu(
                "h100-80gb",
                "NVIDIA H100 SXM 80GB",
                80 * G,
                3_350 * G,
                _H100_SXM,
                "NVLink 4",
                900 * G,
                # H100 datasheet, H100 SXM: 80GB, 3.35 TB/s; NVLink 900 GB/s.
                "NVIDIA H100 datasheet; Hopper architecture whitepaper (dense figures)",
            ),
            _gpu(
                "h100-pcie",
                "NVIDIA H100 PCIe 80GB",
                80 * G,
                2_000 * G,
                # H100 datasheet, H100 PCIe: FP32 51; TF32 756, BF16 1,513, FP16 1,513, FP8 3,026,
                # INT8 3,026 TOPS with sparsity; dense = half (1,513 / 2 = 756.5, kept rounded down to
                # 756 as train-time has always used).
                {
                    "fp32": 51 * T,
                    "tf32": 378 * T,
                    "bf16": 756 * T,
                    "fp16": 756 * T,
                    "fp8": 1_513 * T,
                    "int8": 1_513 * T,
                },
                "NVLink bridge",
                600 * G,
                # H100 datasheet, H100 PCIe: 80GB, 2 TB/s; NVLink 600 GB/s (PCIe Gen5 128 GB/s).
                "NVIDIA H100 datasheet",
            ),
            _gpu(
                "h200",
                "NVIDIA H200 SXM 141GB",
                141 * G,
                4_800 * G,
                _H100_SXM,  # H200 datasheet: the H100 SXM's compute (FP32 67, BF16 1,979 sparse, ...)
                "NVLink 4",
                900 * G,
                # H200 datasheet, H200 SXM: 141GB HBM3e, 4.8 TB/s; NVLink 900 GB/s.
                "NVIDIA H200 Tensor Core GPU datasheet",
            ),
            _gpu(
                "b200",
                "NVIDIA B200 (HGX, 1,000 W)",
                180 * G,
                8_000 * G,
                # HGX B200 datasheet, board of 8 GPUs: FP32 600 TFLOPS (75 per GPU); per GPU TF32
                # 2.2 PF, BF16/FP16 4.5 PF, FP8 9 PF, INT8 9 POPS with sparsity; dense = half.
                {
                    "fp32": 75 * T,
                    "tf32": 1_100 * T,
                    "bf16": 2_250 * T,
                    "fp16": 2_250 * T,
                    "fp8": 4_500 * T,
                    "int8": 4_500 * T,
                },
                "NVLink 5",
                1_800 * G,
                # HGX B200 datasheet: 1,440 GB HBM3e for 8 GPUs = 180 GB each; DGX B200: 64 TB/s for
                # 8 GPUs = 8 TB/s each; NVLink 5: 1.8 TB/s per GPU (14.4 TB/s for 8).
                "NVIDIA HGX B200 / DGX B200 datasheets (per-GPU = board / 8)",
            ),
            _gpu(
                "l4",
                "NVIDIA L4 24GB",
                24 * G,
                300 * G,
                # L4 datasheet: FP32 30.3 TFLOPS; TF32 120, BF16 242, FP16 242, FP8 485, INT8 485 TOPS
                # with sparsity; dense = half (485 / 2 = 242.5).
                {
                    "fp32": 303 * _D,
                    "tf32": 60 * T,
                    "bf16": 121 * T,
                    "fp16": 121 * T,
                    "fp8": 2425 * _D,
                    "int8": 2425 * _D,
                },
                "PCIe Gen4 x16 (no NVLink)",
                64 * G,
                # L4 datasheet: 24GB GDDR6, 300 GB/s; PCIe Gen4 x16 64 GB/s.
                "NVIDIA L4 Tensor Core GPU datasheet",
            ),
            _gpu(
                "mi300x",
                "AMD Instinct MI300X",
                192 * G,
                5_300 * G,
                # MI300X datasheet: matrix FP32 163.4 TFLOPS; TF32 653.7; FP16/BF16 1,307.4;
                # FP8 2,614.9; INT8 2,614.9 TOPS (dense; sparse figures are twice these).
                {
                    "fp32": 1634 * _D,
                    "tf32": 6537 * _D,
                    "bf16": 13074 * _D,
                    "fp16": 13074 * _D,
                    "fp8": 26149 * _D,
                    "int8": 26149 * _D,
                },
                "Infinity Fabric (7 links)",
                896 * G,
                # MI300X datasheet: 192 GB HBM3, 5.3 TB/s; 7 Infinity Fabric links, 896 GB/s peak.
                "AMD Instinct MI300X datasheet",
            ),
            _gpu(
                "v100",
                "NVIDIA V100 SXM2 32GB",
                32 * G,
                900 * G,
                # V100 datasheet, SXM2: single precision 15.7 TFLOPS; tensor 125 TFLOPS (fp16 in,
                # fp32 accumulate).  No tf32, no bf16.
                {"fp32": 157 * _D, "fp16": 125 * T},
                "NVLink 2",
                300 * G,
                # V100 datasheet: 32/16 GB HBM2, 900 GB/s; NVLink 300 GB/s.
                "NVIDIA Tesla V100 datasheet",
            ),
            _gpu(
                "rtx-4090",
                "NVIDIA GeForce RTX 4090",
                24 * G,
                1_008 * G,
                # Ada Lovelace whitepaper, appendix (RTX 4090): FP32 82.6; TF32 82.6 dense; BF16/FP16
                # with FP32 accumulate 165.2 dense (330.4 sparse); INT8 660.6 dense.
                {"fp32": 826 * _D, "tf32": 826 * _D, "bf16": 1652 * _D, "fp16": 1652 * _D, "int8": 6606 * _D},
                "PCIe Gen4 x16 (no NVLink)",
                64 * G,
                # Ada whitepaper: 24 GB GDDR6X, 1,008 GB/s.
                "NVIDIA Ada Lovelace architecture whitepaper",
            ),
        )
    }
)
"""name -> ``GPU``, in this order."""

ALIASES = MappingProxyType(
    {
        "a100": "a100-80gb",
        "h100-sxm": "h100-80gb",
        "h100": "h100-80gb",
        "h100-sxm-80gb": "h100-80gb",
        "4090": "rtx-4090",
    }
)
"""Short and older names (``train-time --gpu a100|h100-sxm`` keep working)."""


def gpu(name: str) -> GPU:
    """The GPU called ``name`` (case-insensitive; aliases allowed), or a one-line error with a guess."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    close = difflib.get_close_matches(key, [*GPUS, *ALIASES], n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    shown = key if len(key) <= 40 else key[:40] + "…"
    raise AccountingError(f"unknown GPU '{shown}'{hint} (valid: {', '.join(GPUS)}; aliases: {', '.join(ALIASES)})")


DEFAULT_GPU = "h100-80gb"
"""The GPU of ``memory``, ``infer`` and ``plan`` when none is named."""

DEFAULT_ALLOWANCE = 3 * 10**9
"""3 GB per GPU: the CUDA context and cuBLAS workspaces (about 0.5–1 GB on an H100), NCCL's
communicator buffers (its default NCCL_BUFFSIZE is 4 MiB per channel and peer; a few hundred MB at
scale) and the caching allocator's fragmentation (a few % of the peak).  A round, stated figure: set
your own with ``--allowance``.  The same for one GPU and for a layout."""


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes one GPU offers the step's peak (or a server's weights, KV cache and temporaries), and
    how they were derived: the GPU's CUDA-reported total less the allowance (``gpu`` and ``allowance``
    set), or ``--budget`` as given (both None)."""

    usable: int
    gpu: GPU | None = None
    allowance: int | None = None

    @property
    def given(self) -> bool:
        return self.gpu is None

    @property
    def rule(self) -> str:
        """One line: the figures and the rule that gave ``usable``."""
        if self.gpu is None:
            return f"budget {fmt_bytes(self.usable)} per GPU: --budget, as given (no allowance subtracted)"
        return (
            f"budget {fmt_bytes(self.usable)} per GPU = {self.gpu.name}'s CUDA total {fmt_bytes(self.gpu.cuda_total)} "
            f"− allowance {fmt_bytes(self.allowance)} (CUDA context, communication buffers, fragmentation; "
            "--allowance)"
        )

    def to_dict(self) -> dict:
        g = self.gpu
        return {
            "usable_bytes": self.usable,
            "rule": "given" if g is None else "cuda_total - allowance",
            "gpu": None if g is None else g.name,
            "cuda_total_bytes": None if g is None else g.cuda_total,
            "cuda_total_source": None if g is None else g.cuda_total_source,
            "allowance_bytes": self.allowance,
        }


def memory_budget(gpu_name: str = DEFAULT_GPU, allowance: int | None = None, budget: int | None = None) -> MemoryBudget:
    """The budget per GPU: ``budget`` as given, else ``gpu_name``'s CUDA total less ``allowance``
    (default ``DEFAULT_ALLOWANCE``).  An allowance beside a given budget, or one that leaves nothing of
    the GPU, is an ``AccountingError``."""
    if budget is not None:
        if allowance is not None:
            raise AccountingError(
                "--budget is the usable bytes per GPU, taken as given; --allowance is subtracted from the GPU's "
                "CUDA total to derive the default budget: give one of them"
            )
        return MemoryBudget(budget)
    g = gpu(gpu_name)
    allowance = DEFAULT_ALLOWANCE if allowance is None else allowance
    if allowance >= g.cuda_total:
        raise AccountingError(
            f"the allowance of {fmt_bytes(allowance)} leaves nothing of the {g.name}'s CUDA total "
            f"{fmt_bytes(g.cuda_total)} for the model: give a smaller --allowance (it covers the CUDA context, "
            "communication buffers and fragmentation)"
        )
    return MemoryBudget(g.cuda_total - allowance, g, allowance)


def as_budget(budget: int | MemoryBudget | None, allowance: int | None = None) -> MemoryBudget:
    """``budget`` itself, bytes as given, or (None) the default GPU's budget with ``allowance``."""
    if isinstance(budget, MemoryBudget):
        if allowance is not None:
            raise AccountingError("an allowance beside a MemoryBudget: the budget already holds its allowance")
        return budget
    return memory_budget(DEFAULT_GPU, allowance, budget)
