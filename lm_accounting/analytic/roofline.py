"""Roofline times of inference on one GPU (or ``tp`` GPUs), from the GPU table's datasheet figures.

A step takes max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) on each rank (Williams et al. 2009,
"Roofline"): compute-bound when FLOPs / bytes (the arithmetic intensity) is above the ridge
peak / bandwidth, memory-bound below.  Assumptions, stated in every output:

* peak = the GPU's dense figure for the compute dtype (bf16; fp32 for fp32 weights): weight-only
  int8/int4/fp8 weights are dequantised into bf16 matmuls; 100 % of peak and of bandwidth;
* bytes = the minimum HBM traffic: every weight read once per step (a mixture of experts reads the
  experts its tokens are routed to: at most min(E, B·k) per MoE layer, the bound used), the KV cache
  written (prefill: P tokens) or read (decode: the keys attended, the new token's K and V included);
  activations are assumed to stay on chip;
* prefill FLOPs are those a causal kernel performs: the full-square count minus the masked half of
  QKᵀ and AV (filled semantics; a static cache's P × C products are all computed);
* with ``tp`` > 1 each rank does 1/tp of the FLOPs and traffic, and two ring all-reduces per layer of
  the B·S·d activations (bf16) each move 2·(tp−1)/tp of them over the GPU's interconnect, one way:
  added to the step, not overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..gpus import GPU
from .params import parameter_breakdown

ROUTED = "layers.*.moe.experts."


@dataclass(frozen=True)
class Phase:
    """One step on one rank: FLOPs, bytes, and the roofline's time."""

    flops: int
    bytes: int
    peak: int
    bandwidth: int
    comm_seconds: float = 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def compute_seconds(self) -> float:
        return self.flops / self.peak

    @property
    def memory_seconds(self) -> float:
        return self.bytes / self.bandwidth

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds) + self.comm_seconds

    @property
    def bound(self) -> str:
        """compute-bound iff FLOPs·bandwidth >= peak·bytes (exact ints: intensity >= ridge)."""
        return "compute-bound" if self.flops * self.bandwidth >= self.peak * self.bytes else "memory-bound"

    def to_dict(self) -> dict:
        return {
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "compute_seconds": self.compute_seconds,
            "memory_seconds": self.memory_seconds,
            "comm_seconds": self.comm_seconds,
            "seconds": self.seconds,
            "bound": self.bound,
        }


def routed_fraction(cfg: ModelConfig, batch: int) -> tuple[int, int]:
    """(routed expert parameters, of which a decode step at batch B reads at most): min(E, B·k)/E of them."""
    if not getattr(cfg, "moe", False):
        return 0, 0
    routed = sum(it.total for it in parameter_breakdown(cfg) if it.key.startswith(ROUTED))
    touched = min(cfg.num_experts, batch * cfg.experts_per_token)
    return routed, routed * touched // cfg.num_experts


def allreduce_seconds(cfg: ModelConfig, tokens: int, gpu: GPU, tp: int, act_bytes: int = 2) -> float:
    """Two ring all-reduces per layer (after attention and after the MLP, Megatron TP) of T·d activations:
    each rank sends and receives 2·(tp−1)/tp of the buffer at the interconnect's one-way bandwidth."""
    if tp == 1:
        return 0.0
    buffer = tokens * cfg.d_model * act_bytes
    return 2 * cfg.num_layers * 2 * (tp - 1) * buffer / (tp * gpu.interconnect_one_way)


def knee_batch(per_seq_flops: int, per_seq_bytes: int, fixed_bytes: int, peak: int, bandwidth: int) -> int | None:
    """The smallest B at which a step of B·f FLOPs and W + B·k bytes is compute-bound:
    B·f·BW >= peak·(W + B·k)  <=>  B >= peak·W / (f·BW − peak·k); None if f·BW <= peak·k (the
    per-sequence intensity f/k is below the ridge: more sequences never make it compute-bound)."""
    slope = per_seq_flops * bandwidth - peak * per_seq_bytes
    if slope <= 0:
        return None
    return max(1, -(-peak * fixed_bytes // slope))
