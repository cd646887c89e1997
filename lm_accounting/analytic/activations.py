"""What autograd keeps alive after the forward pass of *our* live model, per component.

Derived from the ops in ``lm_accounting.model`` and the tensors torch 2.13's autograd
formulas save (``tools/autograd/derivatives.yaml``).  The total equals the live bytes
after the forward pass minus the step's baseline, byte for byte (checked against the
storage tracker in ``tests/test_memory_exact.py``).  Notation: T = B·S tokens, e = bytes
per element of the model dtype; RMSNorm computes in fp32 (4 bytes).  The components and
their order are ``components.REGISTRY``; the formulas are below, one per component.
"""

from __future__ import annotations

from ..breakdown import Breakdown
from ..config import ModelConfig
from .sizes import Sizes

FP32 = 4  # RMSNorm computes in float32 whatever the model dtype (model/layers.py RMSNorm)


def norm_saved_bytes(z: Sizes, rows: int, width: int) -> int:
    """RMSNorm keeps rsqrt (rows·4) and y = x·rsqrt (rows·width·4); a 16-bit model also keeps
    the fp32 copy of its input and of its gain (mul saves both operands)."""
    kept = rows * FP32 + rows * width * FP32
    if z.e != FP32:
        kept += rows * width * FP32 + width * FP32
    return kept


def residual_saved_bytes(z: Sizes) -> int:
    """fp32: the block's input and middle residual stream, kept by ln1 and ln2 (2·T·d·4);
    16-bit: 0 (the norms keep fp32 copies instead, counted under them)."""
    return 2 * z.act(z.cfg.d_model) if z.e == FP32 else 0


def block_norm_saved_bytes(z: Sizes) -> int:
    """ln1 or ln2: the norm's own tensors plus its output, kept by the projections it feeds."""
    return norm_saved_bytes(z, z.T, z.cfg.d_model) + z.act(z.cfg.d_model)


def final_norm_saved_bytes(z: Sizes) -> int:
    """ln_final: as a block norm, plus (fp32) its input, the last residual stream."""
    return block_norm_saved_bytes(z) + (z.act(z.cfg.d_model) if z.e == FP32 else 0)


def qk_norm_saved_bytes(z: Sizes, heads: int) -> int:
    """Per-head RMSNorm on Q or K: as RMSNorm over T·heads rows of d_head, plus (fp32) its input."""
    width = z.act(heads * z.cfg.d_head)
    return norm_saved_bytes(z, z.T * heads, z.cfg.d_head) + (width if z.e == FP32 else 0)


def rope_saved_bytes(z: Sizes) -> int:
    """Rotated Q and K (kept by QKᵀ), and the gathered cos and sin rows of both rotations."""
    return z.act(z.cfg.q_dim) + z.act(z.cfg.kv_dim) + 4 * z.rope_table


def softmax_saved_bytes(z: Sizes) -> int:
    """exp(z) and its row sums (kept by the division)."""
    return z.scores + z.score_rows


def av_saved_bytes(z: Sizes) -> int:
    """The probabilities and a contiguous V (kept by AV)."""
    return z.scores + z.act(z.cfg.kv_dim)


def cross_entropy_saved_bytes(z: Sizes) -> int:
    """z = logits − max (kept by gather), exp(z), its row sums, and the 0-d loss."""
    return 2 * z.act(z.cfg.vocab_size) + z.act(1) + z.e


def saved_activation_breakdown(cfg: ModelConfig, seq: int, batch: int = 1, dtype: str = "fp32") -> Breakdown:
    """Bytes saved for backward after ``loss = cross_entropy(model(tokens), targets)``, per component.

    Per layer: the residual stream (fp32), ln1/ln2, qk-norms, RoPE, softmax, AV, the merged
    heads kept by output_proj, and the SwiGLU pieces (w1 out, σ and SiLU, w3 out, the gated
    product).  Once: the boolean causal mask, ln_final and the cross-entropy.
    """
    from ..components import breakdown

    return breakdown("saved", Sizes.of(cfg, seq, batch, dtype))
