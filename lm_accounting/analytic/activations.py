"""What autograd keeps alive after the forward pass of *our* live model, per component.

Derived from the ops in ``lm_accounting.model`` and the tensors torch 2.13's autograd
formulas save (``tools/autograd/derivatives.yaml``).  The total equals the live bytes
after the forward pass minus the step's baseline, byte for byte (checked against the
storage tracker in ``tests/test_memory_exact.py``).  Notation: T = B·S tokens, e = bytes
per element of the model dtype; RMSNorm computes in fp32 (4 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..breakdown import Breakdown, Item
from ..config import ModelConfig
from ..names import DTYPE_BYTES
from .flops import check_batch_seq


@dataclass(frozen=True)
class Sizes:
    """Bytes of every tensor shape the live model creates, for one (cfg, B, S, dtype)."""

    cfg: ModelConfig
    batch: int
    seq: int
    e: int  # bytes per element of the model dtype

    @property
    def T(self) -> int:
        return self.batch * self.seq

    def act(self, width: int, rows: int | None = None) -> int:
        """A (rows x width) activation in the model dtype; rows default to T."""
        return (self.T if rows is None else rows) * width * self.e

    @property
    def scores(self) -> int:
        """One (B, h, S, S) attention tensor."""
        return self.batch * self.cfg.num_heads * self.seq * self.seq * self.e

    @property
    def score_rows(self) -> int:
        """One (B, h, S, 1) softmax row statistic."""
        return self.batch * self.cfg.num_heads * self.seq * self.e

    @property
    def rope_table(self) -> int:
        """cos or sin rows gathered for the S positions: S x d_head/2, cast to the model dtype."""
        return self.seq * (self.cfg.d_head // 2) * self.e


def norm_saved_bytes(z: Sizes, rows: int, width: int) -> int:
    """RMSNorm keeps rsqrt (rows·4) and y = x·rsqrt (rows·width·4); a 16-bit model also keeps
    the fp32 copy of its input and of its gain (mul saves both operands)."""
    kept = rows * 4 + rows * width * 4
    if z.e != 4:
        kept += rows * width * 4 + width * 4
    return kept


def saved_activation_breakdown(cfg: ModelConfig, seq: int, batch: int = 1, dtype: str = "fp32") -> Breakdown:
    """Bytes saved for backward after ``loss = cross_entropy(model(tokens), targets)``.

    Per layer: the residual stream (fp32: the block input and middle, kept by the norms),
    ln1/ln2 (rsqrt, y, [fp32 copies], the output kept by the projections), qk-norms,
    RoPE (rotated q and k kept by QKᵀ; gathered cos/sin rows), softmax (exp and its row
    sums), AV (probabilities and a contiguous V), the merged heads kept by output_proj,
    and the SwiGLU pieces (w1 out, σ and SiLU, w3 out, the gated product).  Once: the
    boolean causal mask, ln_final, and the cross-entropy (z = logits − max, kept by
    gather; exp(z); its row sums; the loss).
    """
    check_batch_seq(batch, seq)
    z = Sizes(cfg, batch, seq, DTYPE_BYTES[dtype])
    c, T, fp32 = cfg, z.T, z.e == 4
    Td, Tq, Tkv, Tf = z.act(c.d_model), z.act(c.q_dim), z.act(c.kv_dim), z.act(c.d_ff)
    ln = norm_saved_bytes(z, T, c.d_model) + Td
    layer: list[tuple[str, str, int, str]] = [
        ("residual", "residual stream kept by the norms", 2 * Td if fp32 else 0, "fp32: 2·T·d·4; 16-bit: 0"),
        ("ln1", "RMSNorm before attention", ln, "T·4 + T·d·4 + T·d·e [+ T·d·4 + d·4]"),
    ]
    if c.qk_norm:
        for key, heads, width in (("q_norm", c.num_heads, Tq), ("k_norm", c.kv_heads, Tkv)):
            kept = norm_saved_bytes(z, T * heads, c.d_head) + (width if fp32 else 0)
            layer.append((f"attn.{key}", f"{key[0].upper()} norm (input, rsqrt, y)", kept, "as RMSNorm, per head"))
    layer += [
        ("attn.rope", "rotated Q, K and cos/sin rows", Tq + Tkv + 4 * z.rope_table, "T·(h+kv)·d_head·e + 2·S·d_head·e"),
        ("attn.softmax", "softmax: exp and row sums", z.scores + z.score_rows, "B·h·S²·e + B·h·S·e"),
        ("attn.av", "AV: probabilities and V", z.scores + Tkv, "B·h·S²·e + T·kv·d_head·e"),
        ("attn.output_proj", "merged heads", Tq, "T·h·d_head·e"),
        ("ln2", "RMSNorm before FFN", ln, "as ln1"),
        ("ffn.w1", "FFN W1 output", Tf, "T·d_ff·e"),
        ("ffn.silu", "sigmoid and SiLU outputs", 2 * Tf, "2·T·d_ff·e"),
        ("ffn.w3", "FFN W3 output", Tf, "T·d_ff·e"),
        ("ffn.gate", "gated product", Tf, "T·d_ff·e"),
    ]
    L, TV = c.num_layers, z.act(c.vocab_size)
    items = (
        Item("mask", "causal mask (bool, shared)", "attention", seq * seq, None, "S²"),
        *(Item(f"layers.*.{k}", label, _group(k), n * L, n, f"L·({f})") for k, label, n, f in layer),
        Item("ln_final", "final RMSNorm", "norms", ln + (Td if fp32 else 0), None, "as ln1 (+ its input)"),
        Item("cross_entropy", "cross-entropy (z, exp z, row sums, loss)", "loss", 2 * TV + z.act(1) + z.e, None,
             "2·T·V·e + T·e + e"),
    )
    return Breakdown("activations saved for backward (implementation-exact)", "bytes", items)


def _group(key: str) -> str:
    if key.startswith("ffn"):
        return "ffn"
    if key.startswith("attn"):
        return "attention"
    return "norms" if key.startswith("ln") else "residual"
