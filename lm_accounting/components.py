"""The one component registry: every piece of the model the tool accounts for, in one table.

A component's key is the live model's module path (``layers.*.attn.q_proj``; ``*`` = every
layer) or, for parameter-free work inside a module, that path plus the op (``layers.*.attn.softmax``).
Each entry carries its label, its group and its formulas, one per quantity it contributes to:

* ``params``      trainable parameters (``analytic/params.py``);
* ``flops``       forward matmul FLOPs, 2·m·n·p (``analytic/flops.py``);
* ``elementwise`` forward non-matmul FLOPs, our stated per-element convention (``analytic/flops.py``);
* ``saved``       bytes autograd keeps for backward (``analytic/activations.py``).

The parameter, FLOP, non-matmul and activation breakdowns, the cross-check and the views all
read this table, in this order: the live model's module registration order (``named_modules()``,
hence ``parameters()``), with parameter-free ops placed inside the module that runs them.
Adding a component (a bias, a router, an expert) is one entry here plus its formula.
No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from .breakdown import Breakdown, Item
from .config import ModelConfig
from .analytic import activations as act
from .analytic import flops as fl
from .analytic import params as pa
from .analytic.sizes import Sizes


class Formula(NamedTuple):
    """One quantity of one component: ``fn(z)`` per occurrence (per layer for ``layers.*``)."""

    fn: Callable[[Sizes], int]
    text: str  # the closed form, per occurrence
    label: str = ""  # overrides the component's label for this quantity


@dataclass(frozen=True)
class Component:
    key: str
    label: str | Callable[[ModelConfig], str]
    group: str
    params: Formula | None = None
    flops: Formula | None = None
    elementwise: Formula | None = None
    saved: Formula | None = None
    present: Callable[[ModelConfig], bool] = lambda cfg: True

    @property
    def per_layer(self) -> bool:
        return self.key.startswith("layers.*.")


QUANTITIES = {  # quantity -> (breakdown title, unit)
    "params": ("parameters", "params"),
    "flops": ("forward FLOPs (matmul)", "FLOPs"),
    "elementwise": ("forward FLOPs (non-matmul, estimate)", "FLOPs"),
    "saved": ("activations saved for backward (implementation-exact)", "bytes"),
}


def _qk_norm(cfg: ModelConfig) -> bool:
    return cfg.qk_norm


def _lm_head_label(cfg: ModelConfig) -> str:
    return "LM head (tied: shares token_embeddings)" if cfg.tie_embeddings else "LM head"


REGISTRY: tuple[Component, ...] = (
    Component("token_embeddings", "token embedding", "embedding",
              params=Formula(lambda z: pa.embedding_params(z.cfg), "V·d")),
    Component("mask", "causal mask (bool, shared)", "attention",
              saved=Formula(lambda z: z.seq * z.seq, "S²")),
    Component("layers.*.residual", "residual stream", "residual",
              saved=Formula(act.residual_saved_bytes, "fp32: 2·T·d·4; 16-bit: 0", "residual stream kept by the norms")),
    Component("layers.*.ln1", "RMSNorm before attention", "norms",
              params=Formula(lambda z: pa.rmsnorm_params(z.cfg.d_model), "d"),
              elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T, z.cfg.d_model), "4·T·d"),
              saved=Formula(act.block_norm_saved_bytes, "T·4 + T·d·4 + T·d·e [+ T·d·4 + d·4]")),
    Component("layers.*.attn.q_proj", "Q projection", "attention projections",
              params=Formula(lambda z: pa.q_proj_params(z.cfg), "d·h·d_head"),
              flops=Formula(lambda z: fl.q_proj_flops(z.cfg, z.T), "2·T·d·h·d_head")),
    Component("layers.*.attn.k_proj", "K projection", "attention projections",
              params=Formula(lambda z: pa.kv_proj_params(z.cfg), "d·kv·d_head"),
              flops=Formula(lambda z: fl.kv_proj_flops(z.cfg, z.T), "2·T·d·kv·d_head")),
    Component("layers.*.attn.v_proj", "V projection", "attention projections",
              params=Formula(lambda z: pa.kv_proj_params(z.cfg), "d·kv·d_head"),
              flops=Formula(lambda z: fl.kv_proj_flops(z.cfg, z.T), "2·T·d·kv·d_head")),
    Component("layers.*.attn.output_proj", "output projection", "attention projections",
              params=Formula(lambda z: pa.output_proj_params(z.cfg), "h·d_head·d"),
              flops=Formula(lambda z: fl.output_proj_flops(z.cfg, z.T), "2·T·h·d_head·d"),
              saved=Formula(lambda z: z.act(z.cfg.q_dim), "T·h·d_head·e", "merged heads")),
    Component("layers.*.attn.q_norm", "Q norm (per head)", "norms", present=_qk_norm,
              params=Formula(lambda z: pa.rmsnorm_params(z.cfg.d_head), "d_head"),
              elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T * z.cfg.num_heads, z.cfg.d_head), "4·T·h·d_head"),
              saved=Formula(lambda z: act.qk_norm_saved_bytes(z, z.cfg.num_heads), "as RMSNorm, per head")),
    Component("layers.*.attn.k_norm", "K norm (per head)", "norms", present=_qk_norm,
              params=Formula(lambda z: pa.rmsnorm_params(z.cfg.d_head), "d_head"),
              elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T * z.cfg.kv_heads, z.cfg.d_head), "4·T·kv·d_head"),
              saved=Formula(lambda z: act.qk_norm_saved_bytes(z, z.cfg.kv_heads), "as RMSNorm, per head")),
    Component("layers.*.attn.rope", "RoPE on Q and K", "attention",
              elementwise=Formula(lambda z: fl.rope_flops(z.T, z.cfg.q_dim + z.cfg.kv_dim), "3·T·(h+kv)·d_head"),
              saved=Formula(act.rope_saved_bytes, "T·(h+kv)·d_head·e + 2·S·d_head·e", "rotated Q, K and cos/sin rows")),
    Component("layers.*.attn.qk", "attention QKᵀ", "attention matmuls",
              flops=Formula(lambda z: fl.attention_scores_flops(z.cfg, z.batch, z.seq), "2·B·h·S²·d_head")),
    Component("layers.*.attn.scale", "score scaling 1/√d_head", "attention",
              elementwise=Formula(lambda z: fl.score_scale_flops(z.score_count), "B·h·S²")),
    Component("layers.*.attn.softmax", "softmax", "attention",
              elementwise=Formula(lambda z: fl.softmax_flops(z.score_count), "5·B·h·S²"),
              saved=Formula(act.softmax_saved_bytes, "B·h·S²·e + B·h·S·e", "softmax: exp and row sums")),
    Component("layers.*.attn.av", "attention AV", "attention matmuls",
              flops=Formula(lambda z: fl.attention_values_flops(z.cfg, z.batch, z.seq), "2·B·h·S²·d_head"),
              saved=Formula(act.av_saved_bytes, "B·h·S²·e + T·kv·d_head·e", "AV: probabilities and V")),
    Component("layers.*.residual.attn", "residual add (attention)", "residual",
              elementwise=Formula(lambda z: fl.residual_add_flops(z.T, z.cfg.d_model), "T·d")),
    Component("layers.*.ln2", "RMSNorm before FFN", "norms",
              params=Formula(lambda z: pa.rmsnorm_params(z.cfg.d_model), "d"),
              elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T, z.cfg.d_model), "4·T·d"),
              saved=Formula(act.block_norm_saved_bytes, "as ln1")),
    Component("layers.*.ffn.w1", "FFN W1 (gate)", "ffn",
              params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d·d_ff"),
              flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d·d_ff"),
              saved=Formula(lambda z: z.act(z.cfg.d_ff), "T·d_ff·e", "FFN W1 output")),
    Component("layers.*.ffn.w2", "FFN W2 (down)", "ffn",
              params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d_ff·d"),
              flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d_ff·d")),
    Component("layers.*.ffn.w3", "FFN W3 (up)", "ffn",
              params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d·d_ff"),
              flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d·d_ff"),
              saved=Formula(lambda z: z.act(z.cfg.d_ff), "T·d_ff·e", "FFN W3 output")),
    Component("layers.*.ffn.silu", "SiLU", "ffn",
              elementwise=Formula(lambda z: fl.silu_flops(z.T, z.cfg.d_ff), "4·T·d_ff"),
              saved=Formula(lambda z: 2 * z.act(z.cfg.d_ff), "2·T·d_ff·e", "sigmoid and SiLU outputs")),
    Component("layers.*.ffn.gate", "gating product", "ffn",
              elementwise=Formula(lambda z: fl.gate_flops(z.T, z.cfg.d_ff), "T·d_ff"),
              saved=Formula(lambda z: z.act(z.cfg.d_ff), "T·d_ff·e", "gated product")),
    Component("layers.*.residual.ffn", "residual add (FFN)", "residual",
              elementwise=Formula(lambda z: fl.residual_add_flops(z.T, z.cfg.d_model), "T·d")),
    Component("ln_final", "final RMSNorm", "norms",
              params=Formula(lambda z: pa.rmsnorm_params(z.cfg.d_model), "d"),
              elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T, z.cfg.d_model), "4·T·d"),
              saved=Formula(act.final_norm_saved_bytes, "as ln1 (+ its input)")),
    Component("lm_head", _lm_head_label, "lm head",
              params=Formula(lambda z: pa.lm_head_params(z.cfg), "d·V (0 when tied)"),
              flops=Formula(lambda z: fl.lm_head_flops(z.cfg, z.T), "2·T·d·V")),
    Component("cross_entropy", "cross-entropy", "loss",
              saved=Formula(act.cross_entropy_saved_bytes, "2·T·V·e + T·e + e", "cross-entropy (z, exp z, row sums, loss)")),
)
"""Every component, in the live model's module order (see the module docstring)."""

FLOP_GROUPS = tuple(dict.fromkeys(c.group for c in REGISTRY if c.flops))
"""The groups of the forward matmul FLOPs, in order: attention projections, attention matmuls, ffn, lm head."""


def components(cfg: ModelConfig, quantity: str) -> list[Component]:
    """The components of ``cfg`` that contribute to ``quantity``, in registry order."""
    return [c for c in REGISTRY if getattr(c, quantity) is not None and c.present(cfg)]


def breakdown(quantity: str, z: Sizes) -> Breakdown:
    """One quantity, per component: a per-layer component's total is L × its per-layer value."""
    title, unit = QUANTITIES[quantity]
    L = z.cfg.num_layers
    items = []
    for c in components(z.cfg, quantity):
        formula: Formula = getattr(c, quantity)
        n = formula.fn(z)
        label = formula.label or (c.label(z.cfg) if callable(c.label) else c.label)
        if c.per_layer:
            items.append(Item(c.key, label, c.group, n * L, n, f"L·({formula.text})"))
        else:
            items.append(Item(c.key, label, c.group, n, None, formula.text))
    return Breakdown(title, unit, tuple(items))
