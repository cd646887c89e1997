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

    @property
    def where(self) -> str:
        return f"{self.gpu} with torch {self.torch}"

    def to_dict(self, section: str) -> dict[str, object]:
        """The JSON form of one section's claim (what ``phrase`` prints)."""
        equal, total = self.equal[section]
        where = f"reports/cuda/{section}.csv"
        return {"gpu": self.gpu, "torch": self.torch, "equal": equal, "compared": total, "table": where}

    def phrase(self, section: str, what: str = "figures") -> str:
        """'measured on NVIDIA H200 with torch 2.11.0+cu130: 1,214 of 1,218 figures equal, reports/cuda/memory.csv'."""
        equal, total = self.equal[section]
        return f"measured on {self.where}: {equal:,} of {total:,} {what} equal, reports/cuda/{section}.csv"


CUDA = GpuRun(
    gpu="NVIDIA H200",
    torch="2.11.0+cu130",
    date="2026-11-26",
    equal={
        "memory": (1214, 1218),  # 174 runs x 7 figures (baseline, forward/backward/step peak and end)
        "parallel": (504, 504),  # 72 ranks x 7 figures
        "flops": (59, 59),  # points with every count (analytic, fvcore, FlopCounterMode) equal
        "inference": (36, 42),  # the 6 others: decode peaks 16-64 KiB above the prediction
    },
)
"""The H200 validation of stop 23 (``benchmarks/cuda_run.sh``)."""
