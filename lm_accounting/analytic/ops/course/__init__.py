"""Our own model (``lm_accounting/model``), ``--impl course``, as programs of the op library: every architecture
the live model builds (``model``), with its layers (``layers``) and its checkpointing (``sac``)."""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from ..engine import Affine, StepInBatch
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
    return out


def predict_step(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    *,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
    cpu_threads: int = 1,
) -> StepInBatch:
    """One training step of our live model of ``cfg`` under ``setup`` (see ``ops.predict_step``).

    ``batch`` 1 replays the step at B = 1 exactly (a size-1 batch dim lets torch view what it copies at B >= 2:
    matmul's reshape of the transposed values for AV); any other ``batch`` gives the lines in B, exact for every
    B >= 2.  A mixture of experts whose routed split depends on B (``moe.lines_in_batch``) is replayed at ``batch``
    itself, exact there.  ``mode`` "plain" with ``device`` "cpu" is what the CPU allocator sees (wrapped Python
    numbers, kernel scratch per ``cpu_threads``, amp's mixed-dtype copies); CUDA's kernel scratch (reductions,
    the embedding's sort, the fused kernels) is not modelled here."""
    if seq > cfg.context_length:  # the live model's refusal (``TransformerLM.forward``)
        raise ValueError(f"sequence length {seq} exceeds context_length={cfg.context_length}")
    b = Affine(1) if batch != 1 and lines_in_batch(cfg, seq) else batch
    return training_step(
        lambda: TransformerLM(cfg, seq, setup, b),
        optimizer=setup.optimizer,
        device=device,
        traced=mode == "traced",
        cpu_threads=cpu_threads,
    )
