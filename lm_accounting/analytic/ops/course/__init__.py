"""Our own model (``lm_accounting/model``), ``--impl course``, as programs of the op library: every architecture
the live model builds (``model``), with its layers (``layers``) and its checkpointing (``sac``)."""

from __future__ import annotations

from dataclasses import dataclass

from ....config import ModelConfig
from ....phases import PhaseBytes
from ....setup import TrainingSetup
from .. import cuda
from ..engine import Affine, PhaseInBatch, StepInBatch
from ..step import training_step
from .model import TransformerLM
from .moe import lines_in_batch


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What the course program does not model for ``cfg`` under ``setup`` (empty: ``predict_step`` is exact)."""
    out = []
    if setup.attention == "sdpa" and cfg.sliding_window is not None:
        out.append("sliding-window attention with attention=sdpa (the live model refuses it)")
    if setup.attention == "sdpa" and cfg.mla:
        out.append("latent attention with attention=sdpa (the live model refuses it)")
    if cfg.hybrid or cfg.attention_output_gate:
        out.append("Gated DeltaNet layers and gated attention (the live model has neither: Qwen3-Next, Qwen3.5)")
    if cfg.indexer:
        out.append("a sparse-attention indexer (the live model has none: DeepSeek-V3.2, GLM-5)")
    if cfg.layer_pattern is not None:
        out.append(
            "a layer pattern with Mamba2 or short-convolution layers (the live model has none: Nemotron-H, LFM2)"
        )
    later = [u for u in cfg.unsupported_for_replay() if u in NOT_PROGRAMMED]
    if later:
        out.append(
            f"{', '.join(later)} (gpt-oss's, Qwen2-MoE's, OLMo's, BLOOM's, Cohere's and Phi's pieces: "
            "not in the course program yet)"
        )
    return out


NOT_PROGRAMMED = (
    "attention sinks",
    "norms without weights",
    "per-head qk-norm gains",
    "LayerNorm qk-norm",
    "ALiBi",
    "embedding norm",
    "LM-head bias",
    "frozen router score bias",
    "shared-expert biases",
    "expert biases",
    "router bias",
    "shared-expert gate",
    "clamped SwiGLU experts",
)
"""Architecture options (``ModelConfig.unsupported_for_replay``) the course program does not transliterate yet."""


def predict_step(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    *,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
    cpu_threads: int = 1,
    optimizer_step: bool = True,
) -> StepInBatch:
    """One training step of our live model of ``cfg`` under ``setup`` (see ``ops.predict_step``).

    The result's lines in B are exact for every B >= 2; with ``batch`` 1 its ``at(1)`` is the step replayed at
    B = 1 (a size-1 batch dim lets torch view what it copies at B >= 2: matmul's reshape of the transposed values
    for AV), so the lines stay usable for capacities.  A mixture of experts whose routed split depends on B (``moe.lines_in_batch``) is replayed at ``batch``
    itself, exact there.  ``mode`` "plain" with ``device`` "cpu" is what the CPU allocator sees (wrapped Python
    numbers, kernel scratch per ``cpu_threads``, amp's mixed-dtype copies); with ``device`` "cuda" it is a GPU's
    plain run (``ops.cuda``: flash and memory-efficient attention, the row sums' and the id sort's scratch), exact
    at ``batch`` (the scratch that is no line in B is taken there)."""
    if seq > cfg.context_length:  # the live model's refusal (``TransformerLM.forward``)
        raise ValueError(f"sequence length {seq} exceeds context_length={cfg.context_length}")
    reasons = cuda.unsupported(cfg, setup) if device == "cuda" else []
    if reasons:  # the live model refuses fp32 with grouped K/V heads on a GPU (``setup.check_cuda_fused_attention``)
        raise ValueError("; ".join(reasons))

    def run(b: Affine | int) -> StepInBatch:
        return training_step(
            lambda: TransformerLM(cfg, seq, setup, b),
            optimizer=setup.optimizer,
            device=device,
            traced=mode == "traced",
            cpu_threads=cpu_threads,
            cuda_batch=batch,
            optimizer_step=optimizer_step,
        )

    if not lines_in_batch(cfg, seq):
        return run(batch)
    lines = run(Affine(1))
    return lines if batch != 1 else at_one(lines, run(1))


@dataclass(frozen=True)
class PhaseAtOne(PhaseInBatch):
    """A phase's lines in B (exact for every B >= 2) with its exact bytes at B = 1."""

    one: PhaseBytes | None = None

    def at(self, batch: int) -> PhaseBytes:
        return self.one if batch == 1 and self.one is not None else super().at(batch)


def at_one(lines: StepInBatch, one: StepInBatch) -> StepInBatch:
    """``lines`` (replayed with B a symbol) whose ``at(1)`` is ``one``'s (replayed with B = 1)."""
    phases = {name: PhaseAtOne(p.peak, p.end, p.copies, one.phases()[name].at(1)) for name, p in lines.phases().items()}
    return StepInBatch(lines.baseline, **phases)
