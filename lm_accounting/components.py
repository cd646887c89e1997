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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .analytic import activations as act
from .analytic import flops as fl
from .analytic import params as pa
from .analytic.sizes import Sizes
from .breakdown import Breakdown, Item
from .config import MLP_NAMES, ModelConfig


class Layers(NamedTuple):
    """Which blocks a ``layers.*`` component occurs in: ``has(cfg, i)``, counted by ``count(cfg)``."""

    symbol: str  # in the formula text: L·(...), L_moe·(...), L_dense·(...)
    count: Callable[[ModelConfig], int]
    has: Callable[[ModelConfig, int], bool]


COL, ROW, VOCAB, REPLICATED = "column", "row", "vocab", "replicated"  # how tensor parallelism cuts a parameter
EXPERT_COL, EXPERT_ROW = "expert column", "expert row"  # a routed-expert stack (E, out, in): out/M, in/M


def _shape(*dims: str) -> Callable[[ModelConfig], tuple[int, ...]]:
    """A stored shape from config fields (names of ``ModelConfig`` attributes)."""
    return lambda cfg: tuple(getattr(cfg, n) for n in dims)


EVERY_LAYER = Layers("L", lambda cfg: cfg.num_layers, lambda cfg, i: True)
DENSE_LAYERS = Layers("L_dense", lambda cfg: cfg.dense_layers, lambda cfg, i: cfg.layer_dense(i))
MOE_LAYERS = Layers("L_moe", lambda cfg: cfg.moe_layers, lambda cfg, i: cfg.layer_moe(i))
ATTENTION_LAYERS = Layers("L_attn", lambda cfg: cfg.attention_layers, lambda cfg, i: cfg.layer_attention(i))
LINEAR_LAYERS = Layers("L_lin", lambda cfg: cfg.linear_layers, lambda cfg, i: not cfg.layer_attention(i))
"""A Gated DeltaNet hybrid's layers: every ``layers.*.attn.*`` component occurs in the attention layers (all
layers but a hybrid's), every ``layers.*.linear_attn.*`` one in the linear-attention layers."""
MAMBA_LAYERS = Layers("L_ssm", lambda cfg: cfg.mamba_layers, lambda cfg, i: cfg.layer_mamba(i))
CONV_LAYERS = Layers("L_conv", lambda cfg: cfg.short_conv_layers, lambda cfg, i: cfg.layer_short_conv(i))
"""The short-convolution layers of a ``layer_pattern`` (its ``C``, LFM2's): every ``layers.*.conv.*`` component."""
"""The Mamba2 layers of a ``layer_pattern`` (its ``M`` and ``H``): every ``layers.*.mamba.*`` component occurs there."""
SSM_LAYERS = Layers("L_s6", lambda cfg: cfg.ssm_layers, lambda cfg, i: cfg.layer_ssm(i))
"""The Mamba (v1) layers of a ``layer_pattern`` (its ``S``): every ``layers.*.ssm.*`` component occurs there."""
INDEXER_LAYERS = Layers("L_idx", lambda cfg: cfg.indexer_layers, lambda cfg, i: cfg.layer_indexer(i))
"""DeepSeek Sparse Attention: the layers that run their own indexer (all, or GLM-5's ``F`` layers)."""


class Formula(NamedTuple):
    """One quantity of one component: ``fn(z)`` per occurrence (per layer for ``layers.*``)."""

    fn: Callable[[Sizes], int]
    text: str | Callable[[ModelConfig], str]  # the closed form, per occurrence (may depend on the config)
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
    layers: Layers = EVERY_LAYER  # for ``layers.*`` keys: the blocks it occurs in
    tensors: Callable[[ModelConfig], int] = lambda cfg: 1  # parameter tensors of equal size (LayerNorm: 2)
    shape: Callable[[ModelConfig], tuple[int, ...]] | None = None  # each one's stored shape (Linear: (out, in))
    split: str = REPLICATED  # how tensor parallelism cuts them (analytic/parallel.py, rule 1)
    frozen: bool = False  # no gradient and no optimizer state: requires_grad=False, or no backward reaches it

    @property
    def per_layer(self) -> bool:
        return self.key.startswith("layers.*.")

    def in_layer(self, cfg: ModelConfig, layer: int) -> bool:
        """Whether block ``layer`` has this component (always False for a component outside the blocks)."""
        return self.per_layer and self.present(cfg) and self.layers.has(cfg, layer)


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


# -- architecture options (config.ARCHITECTURE_CHOICES): which components exist, and their texts --
def _norm_name(cfg: ModelConfig) -> str:
    return "LayerNorm" if cfg.norm == "layernorm" else "RMSNorm"


def _norm_label(where: str) -> Callable[[ModelConfig], str]:
    return lambda cfg: f"{_norm_name(cfg)} {where}"


def _norm_params_text(cfg: ModelConfig) -> str:
    if not cfg.norm_weights:
        return "0 (no weights)"
    return "2·d (gain and bias)" if cfg.norm == "layernorm" and cfg.norm_bias else "d"


def _norm_flops_text(cfg: ModelConfig) -> str:
    if not cfg.norm_weights:
        return "5·T·d" if cfg.norm == "layernorm" else "3·T·d"
    if cfg.norm == "layernorm":
        return "7·T·d" if cfg.norm_bias else "6·T·d (no bias add)"
    return "4·T·d"


def _norm_tensors(cfg: ModelConfig) -> int:
    """A block-width norm's parameter tensors: LayerNorm's gain and bias, or RMSNorm's gain (none without
    weights, OLMo)."""
    if not cfg.norm_weights:
        return 0
    return 2 if cfg.norm == "layernorm" and cfg.norm_bias else 1


def _norm(width: Callable[[Sizes], int]) -> tuple[Formula, Formula]:
    """params and elementwise formulas of one block-width norm of the config's kind."""
    return (
        Formula(lambda z: pa.norm_params(z.cfg, width(z)), _norm_params_text),
        Formula(lambda z: fl.norm_flops(z.cfg, z.T, width(z)), _norm_flops_text),
    )


def _qk_norm_shape(heads: str) -> Callable[[ModelConfig], tuple[int, ...]]:
    """Per head: (d_head,); whole projection (OLMo-2): (heads·d_head,); a gain per head (Cohere): (heads, d_head)."""

    def shape(cfg: ModelConfig) -> tuple[int, ...]:
        if cfg.qk_norm_scope == "head_weights":
            return (getattr(cfg, heads), cfg.d_head)
        return (cfg.d_head if cfg.qk_norm_scope == "head" else getattr(cfg, heads) * cfg.d_head,)

    return shape


def _qk_norm_label(which: str) -> Callable[[ModelConfig], str]:
    scope = {"head": "per head", "projection": "whole projection", "head_weights": "per head, a gain each"}
    return lambda cfg: f"{which} {'LayerNorm' if cfg.norm == 'layernorm' else 'norm'} ({scope[cfg.qk_norm_scope]})"


def _qk_norm_text(heads: str) -> Callable[[ModelConfig], str]:
    def text(cfg: ModelConfig) -> str:
        width = "d_head" if cfg.qk_norm_scope == "head" else f"{heads}·d_head"
        return f"2·{width}" if _qk_norm_tensors(cfg) == 2 else width

    return text


def _qk_norm_tensors(cfg: ModelConfig) -> int:
    """A q/k norm's tensors: a gain, and a bias for a LayerNorm with ``norm_bias``."""
    return 2 if cfg.norm == "layernorm" and cfg.norm_bias else 1


def _qk_norm_flops_text(heads: str) -> Callable[[ModelConfig], str]:
    def text(cfg: ModelConfig) -> str:
        per = 4 if cfg.norm != "layernorm" else 7 if cfg.norm_bias else 6
        return f"{per}·T·{heads}·d_head"

    return text


def _bias(
    key: str,
    label: str,
    group: str,
    width: Callable[[ModelConfig], int],
    text: str,
    present: Callable[[ModelConfig], bool],
    layers: Layers = EVERY_LAYER,
    split: str = COL,
) -> Component:
    """A projection's bias (``key`` = the projection's path + ``.bias``): ``width`` parameters, and one add
    per output element, an elementwise FLOP (``fl.BIAS_PER_ELEMENT``) that no counter calls a matmul.
    ``split``: a column-parallel projection's bias is cut with it; a row-parallel one's is whole."""
    return Component(
        key,
        label,
        group,
        present=present,
        layers=layers,
        shape=lambda cfg: (width(cfg),),
        split=split,
        params=Formula(lambda z: pa.bias_params(width(z.cfg)), text),
        elementwise=Formula(lambda z: fl.bias_add_flops(z.T, width(z.cfg)), f"T·{text}"),
    )


def _pre_norms(cfg: ModelConfig) -> bool:
    return cfg.pre_norms


def _post_norms(cfg: ModelConfig) -> bool:
    return cfg.post_norms


def _rope(cfg: ModelConfig) -> bool:
    return cfg.positions == "rope"


def _gated(cfg: ModelConfig) -> bool:
    return cfg.gated_mlp


def _gelu_mlp(cfg: ModelConfig) -> bool:
    """The 2-matrix MLP (fc, proj): GELU, ReLU or squared ReLU (``config.ARCHITECTURE_CHOICES``)."""
    return not cfg.gated_mlp


def _qkv_bias(cfg: ModelConfig) -> bool:
    return cfg.qkv_bias


def _moe(cfg: ModelConfig) -> bool:
    return cfg.moe


def _not_mla(cfg: ModelConfig) -> bool:
    return not cfg.mla


def _q_lora(cfg: ModelConfig) -> bool:
    return cfg.q_lora_rank is not None


def _mla(cfg: ModelConfig) -> bool:
    return cfg.mla


def _indexer(cfg: ModelConfig) -> bool:
    return cfg.indexer


def _projection(key: str, label: str, group: str, params: Callable[[ModelConfig], int], text: str, **kw) -> Component:
    """A bias-free linear map on every token: ``params(cfg)`` weights and 2·T·params FLOPs."""
    return Component(
        key,
        label,
        group,
        params=Formula(lambda z: params(z.cfg), text),
        flops=Formula(lambda z: fl.projection_flops(z.T, params(z.cfg)), f"2·T·{text}"),
        **kw,
    )


def _rmsnorm(key: str, label: str, width: Callable[[ModelConfig], int], text: str, **kw) -> Component:
    """An RMSNorm gain of ``width(cfg)`` over every token (MLA's latent norms)."""
    return Component(
        key,
        label,
        "norms",
        params=Formula(lambda z: pa.rmsnorm_params(width(z.cfg)), text),
        elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T, width(z.cfg)), f"4·T·{text}"),
        shape=lambda cfg: (width(cfg),),
        **kw,
    )


def _v(cfg: ModelConfig) -> str:
    """The value head's symbol: d_v under latent attention (narrower than d_head), else d_head."""
    return "d_v" if cfg.mla else "d_head"


def _rope_width(cfg: ModelConfig) -> int:
    """Elements RoPE rotates per token: every Q and K head's d_head, (h + kv)·d_head, or its first rotary_dim
    (partial rotary: the rest passes through, no FLOP); under latent attention the RoPE part of each Q head and
    the one shared RoPE key, (h + 1)·qk_rope_head_dim."""
    if cfg.mla:
        return (cfg.num_heads + 1) * cfg.rope_dim
    return (cfg.num_heads + cfg.kv_heads) * cfg.rope_dim


def _expert_swiglu(
    prefix: str,
    label: str,
    width: Callable[[ModelConfig], int],
    rows: Callable[[Sizes], int],
    text: str,
    rows_text: str | Callable[[ModelConfig], str],
    present: Callable[[ModelConfig], bool],
    count: Callable[[ModelConfig], int],
    count_text: str,
    saved: Callable[[Sizes, str], int],
    saved_text: dict[str, str],
    stacked: bool,
) -> tuple[Component, ...]:
    """W1, W2, W3, SiLU and gate of a SwiGLU of hidden ``width`` run on ``rows(z)`` token rows, with
    ``count(cfg)`` copies of its weights (E routed experts; 1 for the shared experts' one MLP);
    ``saved(z, part)``: the bytes each part keeps for backward, described by ``saved_text[part]``.
    ``stacked``: the weights are one (E, out, in) tensor per matrix (routed), else one (out, in)."""

    def rt(cfg: ModelConfig) -> str:
        return rows_text(cfg) if callable(rows_text) else rows_text

    def kept(part: str) -> Formula:
        return Formula(lambda z: saved(z, part), saved_text[part])

    def shape(name: str) -> Callable[[ModelConfig], tuple[int, ...]]:
        def of(cfg: ModelConfig) -> tuple[int, ...]:
            out_in = (cfg.d_model, width(cfg)) if name == "w2" else (width(cfg), cfg.d_model)
            return (count(cfg), *out_in) if stacked else out_in

        return of

    def split(name: str) -> str:
        if stacked:
            return EXPERT_ROW if name == "w2" else EXPERT_COL
        return ROW if name == "w2" else COL

    def matrix(name: str, what: str) -> Component:
        return Component(
            f"{prefix}.{name}",
            f"{label} {name.upper()} ({what})",
            "ffn",
            present=present,
            layers=MOE_LAYERS,
            params=Formula(lambda z: count(z.cfg) * z.cfg.d_model * width(z.cfg), f"{count_text}d·{text}"),
            flops=Formula(
                lambda z: fl.matmul_flops(rows(z), z.cfg.d_model, width(z.cfg)), lambda cfg: f"2·{rt(cfg)}·d·{text}"
            ),
            saved=kept(name),
            shape=shape(name),
            split=split(name),
        )

    def bias(name: str) -> Component:
        """A matrix's bias: routed experts with ``expert_bias`` (stacked: gpt-oss's ``gate_up_proj_bias`` holds
        W1's and W3's, ``down_proj_bias`` W2's), ``count`` rows of its output width; the shared experts with
        ``mlp_bias`` (one ``Linear`` bias each, Ernie 4.5's ``use_bias``).  One add per output element of the
        rows that ran."""
        out = (lambda cfg: cfg.d_model) if name == "w2" else width
        out_text = "d" if name == "w2" else text
        return Component(
            f"{prefix}.{name}.bias",
            f"{label} {name.upper()} bias",
            "ffn",
            present=lambda cfg: present(cfg) and (cfg.expert_bias if stacked else cfg.mlp_bias),
            layers=MOE_LAYERS,
            params=Formula(lambda z: count(z.cfg) * pa.bias_params(out(z.cfg)), f"{count_text}{out_text}"),
            elementwise=Formula(lambda z: fl.bias_add_flops(rows(z), out(z.cfg)), lambda cfg: f"{rt(cfg)}·{out_text}"),
            shape=lambda cfg: (count(cfg), out(cfg)) if stacked else (out(cfg),),
            split=(EXPERT_ROW if name == "w2" else EXPERT_COL) if stacked else (REPLICATED if name == "w2" else COL),
        )

    def act(z: Sizes) -> int:
        if stacked and z.cfg.swiglu_limit is not None:
            return fl.clamped_swiglu_flops(rows(z), width(z.cfg))
        return fl.silu_flops(rows(z), width(z.cfg))

    def act_text(cfg: ModelConfig) -> str:
        return f"{9 if stacked and cfg.swiglu_limit is not None else 4}·{rt(cfg)}·{text}"

    def act_label(cfg: ModelConfig) -> str:
        clamped = stacked and cfg.swiglu_limit is not None
        return f"{label} {'clamped SwiGLU activation (gpt-oss)' if clamped else 'SiLU'}"

    return (
        matrix("w1", "gate"),
        bias("w1"),
        matrix("w2", "down"),
        bias("w2"),
        matrix("w3", "up"),
        bias("w3"),
        Component(
            f"{prefix}.silu",
            act_label,
            "ffn",
            present=present,
            layers=MOE_LAYERS,
            elementwise=Formula(act, act_text),
            saved=kept("silu"),
        ),
        Component(
            f"{prefix}.gate",
            f"{label} gating product",
            "ffn",
            present=present,
            layers=MOE_LAYERS,
            elementwise=Formula(lambda z: fl.gate_flops(rows(z), width(z.cfg)), lambda cfg: f"{rt(cfg)}·{text}"),
            saved=kept("gate"),
        ),
    )


def _hybrid(cfg: ModelConfig) -> bool:
    return cfg.hybrid


def _linear_projection(key: str, label: str, out: Callable[[ModelConfig], int], text: str) -> Component:
    """A Gated DeltaNet input projection d -> ``out(cfg)``, bias-free, column-parallel."""
    return _projection(
        key,
        label,
        "attention projections",
        lambda cfg: pa.linear_in_proj_params(cfg, out(cfg)),
        f"d·{text}",
        shape=lambda cfg: (out(cfg), cfg.d_model),
        split=COL,
        present=_hybrid,
        layers=LINEAR_LAYERS,
    )


GATED_DELTANET: tuple[Component, ...] = (
    _linear_projection(
        "layers.*.linear_attn.in_proj_qkv",
        "Gated DeltaNet q, k, v projection",
        lambda cfg: cfg.linear_conv_dim,
        "(2·H_k·d_k + H_v·d_v)",
    ),
    _linear_projection(
        "layers.*.linear_attn.in_proj_z",
        "Gated DeltaNet output-gate projection z",
        lambda cfg: cfg.linear_value_dim,
        "H_v·d_v",
    ),
    _linear_projection(
        "layers.*.linear_attn.in_proj_b", "Gated DeltaNet β projection", lambda cfg: cfg.linear_value_heads, "H_v"
    ),
    _linear_projection(
        "layers.*.linear_attn.in_proj_a",
        "Gated DeltaNet α (decay) projection",
        lambda cfg: cfg.linear_value_heads,
        "H_v",
    ),
    Component(
        "layers.*.linear_attn.conv1d",
        "Gated DeltaNet causal conv1d (depthwise, K taps)",
        "linear attention",
        present=_hybrid,
        layers=LINEAR_LAYERS,
        params=Formula(lambda z: pa.linear_conv_params(z.cfg), "(2·H_k·d_k + H_v·d_v)·K"),
        shape=lambda cfg: (cfg.linear_conv_dim, 1, cfg.linear_conv_kernel),
        split=COL,
        flops=Formula(lambda z: fl.causal_conv_flops(z.cfg, z.batch, z.seq), "2·B·(2·H_k·d_k + H_v·d_v)·(S+K−1)·K"),
        elementwise=Formula(
            lambda z: fl.silu_flops(z.T, z.cfg.linear_conv_dim),
            "4·T·(2·H_k·d_k + H_v·d_v)",
            "SiLU after the causal conv1d",
        ),
    ),
    Component(
        "layers.*.linear_attn.dt_bias",
        "Gated DeltaNet dt_bias (per value head)",
        "attention",
        present=_hybrid,
        layers=LINEAR_LAYERS,
        params=Formula(lambda z: z.cfg.linear_value_heads, "H_v"),
        shape=lambda cfg: (cfg.linear_value_heads,),
        split=COL,
    ),
    Component(
        "layers.*.linear_attn.A_log",
        "Gated DeltaNet A_log (per value head)",
        "attention",
        present=_hybrid,
        layers=LINEAR_LAYERS,
        params=Formula(lambda z: z.cfg.linear_value_heads, "H_v"),
        shape=lambda cfg: (cfg.linear_value_heads,),
        split=COL,
    ),
    Component(
        "layers.*.linear_attn.core",
        "gated delta rule (chunked, C = 64)",
        "linear attention",
        present=_hybrid,
        layers=LINEAR_LAYERS,
        flops=Formula(
            lambda z: fl.gated_delta_flops(z.cfg, z.batch, z.seq), "2·B·H_v·⌈S/64⌉·64·(128·d_k + 3·d_k·d_v + 64·d_v)"
        ),
        elementwise=Formula(
            lambda z: fl.delta_solve_flops(z.cfg, z.batch, z.seq),
            "B·H_v·⌈S/64⌉·64·63·(d_k + d_v)",
            "gated delta rule: triangular solves",
        ),
    ),
    Component(
        "layers.*.linear_attn.norm",
        "Gated DeltaNet gated RMSNorm (per value head)",
        "norms",
        present=_hybrid,
        layers=LINEAR_LAYERS,
        params=Formula(lambda z: pa.rmsnorm_params(z.cfg.linear_value_head_dim), "d_v"),
        shape=lambda cfg: (cfg.linear_value_head_dim,),
        elementwise=Formula(lambda z: fl.gated_norm_flops(z.T, z.cfg.linear_value_dim), "9·T·H_v·d_v"),
    ),
    _projection(
        "layers.*.linear_attn.out_proj",
        "Gated DeltaNet output projection",
        "attention projections",
        lambda cfg: cfg.linear_value_dim * cfg.d_model,
        "H_v·d_v·d",
        shape=lambda cfg: (cfg.d_model, cfg.linear_value_dim),
        split=ROW,
        present=_hybrid,
        layers=LINEAR_LAYERS,
    ),
)
"""A Gated DeltaNet layer (``Qwen3NextGatedDeltaNet``, models/qwen3_next/modeling_qwen3_next.py; Qwen3.5's
``Qwen3_5GatedDeltaNet`` has the same tensors with ``in_proj_qkvz`` and ``in_proj_ba`` unfused): its matmul FLOPs
are the projections, the conv (``flops.causal_conv_flops``) and the chunked rule (``flops.gated_delta_flops``), on
transformers' torch path."""


def _two_sublayers(cfg: ModelConfig) -> bool:
    """A block of two sublayers, mixer then FFN, each with its norm and residual add: all but Nemotron-H's blocks
    (a ``layer_pattern`` without ``mixer_ffn``: one mixer per block)."""
    return cfg.layer_pattern is None or cfg.mixer_ffn


def _mamba(cfg: ModelConfig) -> bool:
    return cfg.mamba_layers > 0


def _mamba_vector(name: str, label: str) -> Component:
    """One of a Mamba2 mixer's per-head vectors (``dt_bias``, ``A_log``, ``D``): H parameters, no FLOP counted."""
    return Component(
        f"layers.*.mamba.{name}",
        label,
        "attention",
        present=_mamba,
        layers=MAMBA_LAYERS,
        params=Formula(lambda z: z.cfg.mamba_heads, "H"),
        shape=lambda cfg: (cfg.mamba_heads,),
        split=COL,
    )


MAMBA2: tuple[Component, ...] = (
    _mamba_vector("dt_bias", "Mamba2 dt_bias (per head)"),
    _mamba_vector("A_log", "Mamba2 A_log (per head)"),
    _mamba_vector("D", "Mamba2 D skip (per head)"),
    Component(
        "layers.*.mamba.conv1d",
        "Mamba2 causal conv1d (depthwise, K taps, over x, B, C)",
        "linear attention",
        present=_mamba,
        layers=MAMBA_LAYERS,
        params=Formula(lambda z: z.cfg.mamba_conv_dim * z.cfg.mamba_conv_kernel, "(H·P + 2·G·N)·K"),
        shape=lambda cfg: (cfg.mamba_conv_dim, 1, cfg.mamba_conv_kernel),
        split=COL,
        flops=Formula(lambda z: fl.mamba_conv_flops(z.cfg, z.batch, z.seq), "2·B·(H·P + 2·G·N)·(S+K−1)·K"),
        elementwise=Formula(
            lambda z: fl.silu_flops(z.T, z.cfg.mamba_conv_dim), "4·T·(H·P + 2·G·N)", "SiLU after the causal conv1d"
        ),
    ),
    _bias(
        "layers.*.mamba.conv1d.bias",
        "Mamba2 conv1d bias",
        "linear attention",
        lambda cfg: cfg.mamba_conv_dim,
        "(H·P + 2·G·N)",
        _mamba,
        MAMBA_LAYERS,
    ),
    _projection(
        "layers.*.mamba.in_proj",
        "Mamba2 input projection (z, x, B, C, dt)",
        "attention projections",
        lambda cfg: cfg.d_model * cfg.mamba_in_width,
        "d·(2·H·P + 2·G·N + H)",
        shape=lambda cfg: (cfg.mamba_in_width, cfg.d_model),
        split=COL,
        present=_mamba,
        layers=MAMBA_LAYERS,
    ),
    Component(
        "layers.*.mamba.core",
        lambda cfg: f"SSD scan (chunked, C = {cfg.mamba_chunk_size})",
        "linear attention",
        present=_mamba,
        layers=MAMBA_LAYERS,
        flops=Formula(
            lambda z: fl.ssd_scan_flops(z.cfg, z.batch, z.seq),
            "2·B·H·(⌈S/C⌉·C²·(N + P) + 2·⌈S/C⌉·C·P·N + (⌈S/C⌉+1)²·P·N)",
        ),
    ),
    Component(
        "layers.*.mamba.norm",
        "Mamba2 gated RMSNorm (per group)",
        "norms",
        present=lambda cfg: _mamba(cfg) and cfg.mamba_norm,
        layers=MAMBA_LAYERS,
        params=Formula(lambda z: pa.rmsnorm_params(z.cfg.mamba_inner), "H·P"),
        shape=lambda cfg: (cfg.mamba_inner,),
        elementwise=Formula(lambda z: fl.gated_norm_flops(z.T, z.cfg.mamba_inner), "9·T·H·P"),
    ),
    _projection(
        "layers.*.mamba.out_proj",
        "Mamba2 output projection",
        "attention projections",
        lambda cfg: cfg.mamba_inner * cfg.d_model,
        "H·P·d",
        shape=lambda cfg: (cfg.d_model, cfg.mamba_inner),
        split=ROW,
        present=_mamba,
        layers=MAMBA_LAYERS,
    ),
)
"""A Mamba2 mixer layer (``NemotronHMamba2Mixer``, models/nemotron_h/modeling_nemotron_h.py; ``config.MAMBA_FIELDS``:
H heads of P, G groups of state N, conv of K taps, chunks of C; Bamba's, Granite-4.0-H's and Falcon-H1's are the same),
in its ``parameters()`` order (the mixer's own vectors, then its modules').  Its matmul FLOPs are transformers' torch
path (no mamba_ssm / causal_conv1d kernels): ``in_proj`` and ``out_proj``, the conv
(``flops.mamba_conv_flops``, torch's convolution formula over the S + K − 1 padded outputs) and the chunked SSD scan's
einsums (``flops.ssd_scan_flops``, over the padded sequence); the conv's bias, the softplus/exp discretisation, the
decays, the D skip and the gated norm are elementwise (the scan's own elementwise work is not estimated)."""


def _short_conv(cfg: ModelConfig) -> bool:
    return cfg.short_conv_layers > 0


def _short_conv_bias(cfg: ModelConfig) -> bool:
    return cfg.short_conv_layers > 0 and cfg.short_conv_bias


SHORT_CONV: tuple[Component, ...] = (
    Component(
        "layers.*.conv.conv1d",
        "short conv1d (depthwise, K taps, over B·x)",
        "linear attention",
        present=_short_conv,
        layers=CONV_LAYERS,
        params=Formula(lambda z: z.cfg.d_model * z.cfg.short_conv_kernel, "d·K"),
        shape=lambda cfg: (cfg.d_model, 1, cfg.short_conv_kernel),
        split=COL,
        flops=Formula(lambda z: fl.short_conv_flops(z.cfg, z.batch, z.seq), "2·B·d·(S+K−1)·K"),
        elementwise=Formula(
            lambda z: fl.short_conv_gate_flops(z.T, z.cfg.d_model), "2·T·d", "short conv gates B·x and C·y"
        ),
    ),
    _bias(
        "layers.*.conv.conv1d.bias",
        "short conv1d bias",
        "linear attention",
        lambda cfg: cfg.d_model,
        "d",
        _short_conv_bias,
        CONV_LAYERS,
    ),
    _projection(
        "layers.*.conv.in_proj",
        "short conv input projection (B, C, x)",
        "attention projections",
        lambda cfg: 3 * cfg.d_model * cfg.d_model,
        "d·3d",
        shape=lambda cfg: (3 * cfg.d_model, cfg.d_model),
        split=COL,
        present=_short_conv,
        layers=CONV_LAYERS,
    ),
    _bias(
        "layers.*.conv.in_proj.bias",
        "short conv input projection bias",
        "attention projections",
        lambda cfg: 3 * cfg.d_model,
        "3d",
        _short_conv_bias,
        CONV_LAYERS,
    ),
    _projection(
        "layers.*.conv.out_proj",
        "short conv output projection",
        "attention projections",
        lambda cfg: cfg.d_model * cfg.d_model,
        "d·d",
        shape=lambda cfg: (cfg.d_model, cfg.d_model),
        split=ROW,
        present=_short_conv,
        layers=CONV_LAYERS,
    ),
    _bias(
        "layers.*.conv.out_proj.bias",
        "short conv output projection bias",
        "attention projections",
        lambda cfg: cfg.d_model,
        "d",
        _short_conv_bias,
        CONV_LAYERS,
        REPLICATED,
    ),
)
"""A short-convolution layer (LFM2's ``Lfm2ShortConv``, models/lfm2/modeling_lfm2.py; a ``C`` of ``layer_pattern``), in
its ``parameters()`` order (``conv``, ``in_proj``, ``out_proj``; a bias on each under ``short_conv_bias``,
``conv_bias``).  Its matmul FLOPs are transformers' torch path: ``in_proj`` (d -> 3·d: B, C, x), the depthwise conv
over B·x (``flops.short_conv_flops``, torch's convolution formula over the S + K − 1 padded outputs) and ``out_proj``;
the gates B·x and C·y and the biases are elementwise."""


def _ssm(cfg: ModelConfig) -> bool:
    return cfg.ssm_layers > 0


def _ssm_norm(name: str, label: str, width: Callable[[ModelConfig], int], text: str, kind: str) -> Component:
    """One of the RMSNorms on a Mamba mixer's dt, B and C (``config.SSM_NORMS``): Jamba's ``rmsnorm`` with a gain
    (``width`` parameters: ``dt_layernorm``, ``b_layernorm``, ``c_layernorm``), Falcon-Mamba's ``weightless`` without
    (``FalconMambaWeightlessRMSNorm``: its ``weight`` is a non-persistent buffer, no parameter); 4 FLOPs per element
    either way (``flops.RMSNORM_PER_ELEMENT``; the weightless norm's cast back stands in for the gain)."""
    return Component(
        f"layers.*.ssm.{name}",
        label,
        "norms",
        present=lambda cfg: _ssm(cfg) and cfg.ssm_norms == kind,
        layers=SSM_LAYERS,
        params=Formula(lambda z: pa.rmsnorm_params(width(z.cfg)), text) if kind == "rmsnorm" else None,
        shape=(lambda cfg: (width(cfg),)) if kind == "rmsnorm" else None,
        elementwise=Formula(lambda z: fl.rmsnorm_flops(z.T, width(z.cfg)), f"4·T·{text}"),
    )


def _ssm_norms(kind: str, what: str) -> tuple[Component, ...]:
    names = ("dt_layernorm", "b_layernorm", "c_layernorm") if kind == "rmsnorm" else ("dt_rms", "b_rms", "c_rms")
    widths = (lambda cfg: cfg.ssm_dt_rank, lambda cfg: cfg.ssm_state_size, lambda cfg: cfg.ssm_state_size)
    labels = ("dt (rank R)", "B", "C")
    return tuple(
        _ssm_norm(n, f"Mamba {what} on {label}", w, t, kind)
        for n, label, w, t in zip(names, labels, widths, ("R", "N", "N"), strict=True)
    )


MAMBA1: tuple[Component, ...] = (
    Component(
        "layers.*.ssm.A_log",
        "Mamba A_log (E × N)",
        "attention",
        present=_ssm,
        layers=SSM_LAYERS,
        params=Formula(lambda z: z.cfg.ssm_inner * z.cfg.ssm_state_size, "E·N"),
        shape=lambda cfg: (cfg.ssm_inner, cfg.ssm_state_size),
        split=COL,
    ),
    Component(
        "layers.*.ssm.D",
        "Mamba D skip (per channel)",
        "attention",
        present=_ssm,
        layers=SSM_LAYERS,
        params=Formula(lambda z: z.cfg.ssm_inner, "E"),
        shape=lambda cfg: (cfg.ssm_inner,),
        split=COL,
    ),
    Component(
        "layers.*.ssm.conv1d",
        "Mamba causal conv1d (depthwise, K taps, over x)",
        "linear attention",
        present=_ssm,
        layers=SSM_LAYERS,
        params=Formula(lambda z: z.cfg.ssm_inner * z.cfg.ssm_conv_kernel, "E·K"),
        shape=lambda cfg: (cfg.ssm_inner, 1, cfg.ssm_conv_kernel),
        split=COL,
        flops=Formula(lambda z: fl.ssm_conv_flops(z.cfg, z.batch, z.seq), "2·B·E·(S+K−1)·K"),
        elementwise=Formula(lambda z: fl.silu_flops(z.T, z.cfg.ssm_inner), "4·T·E", "SiLU after the causal conv1d"),
    ),
    _bias(
        "layers.*.ssm.conv1d.bias",
        "Mamba conv1d bias",
        "linear attention",
        lambda cfg: cfg.ssm_inner,
        "E",
        _ssm,
        SSM_LAYERS,
    ),
    _projection(
        "layers.*.ssm.in_proj",
        "Mamba input projection (x, z)",
        "attention projections",
        lambda cfg: cfg.d_model * 2 * cfg.ssm_inner,
        "d·2E",
        shape=lambda cfg: (2 * cfg.ssm_inner, cfg.d_model),
        split=COL,
        present=_ssm,
        layers=SSM_LAYERS,
    ),
    _projection(
        "layers.*.ssm.x_proj",
        "Mamba x_proj (dt, B, C)",
        "attention projections",
        lambda cfg: cfg.ssm_inner * cfg.ssm_x_width,
        "E·(R + 2N)",
        shape=lambda cfg: (cfg.ssm_x_width, cfg.ssm_inner),
        present=_ssm,
        layers=SSM_LAYERS,
    ),
    _projection(
        "layers.*.ssm.dt_proj",
        "Mamba dt_proj (rank R -> E)",
        "attention projections",
        lambda cfg: cfg.ssm_dt_rank * cfg.ssm_inner,
        "R·E",
        shape=lambda cfg: (cfg.ssm_inner, cfg.ssm_dt_rank),
        split=COL,
        present=_ssm,
        layers=SSM_LAYERS,
    ),
    Component(  # added inside the scan: its elementwise add is SCAN_PER_CHANNEL's first
        "layers.*.ssm.dt_proj.bias",
        "Mamba dt_proj bias",
        "attention projections",
        present=_ssm,
        layers=SSM_LAYERS,
        params=Formula(lambda z: pa.bias_params(z.cfg.ssm_inner), "E"),
        shape=lambda cfg: (cfg.ssm_inner,),
        split=COL,
    ),
    Component(
        "layers.*.ssm.core",
        "selective scan (sequential, state read-out by C)",
        "linear attention",
        present=_ssm,
        layers=SSM_LAYERS,
        flops=Formula(lambda z: fl.selective_scan_flops(z.cfg, z.batch, z.seq), "2·B·S·E·N"),
        elementwise=Formula(lambda z: fl.selective_scan_elementwise(z.cfg, z.T), "6·T·E·N + 9·T·E"),
    ),
    _projection(
        "layers.*.ssm.out_proj",
        "Mamba output projection",
        "attention projections",
        lambda cfg: cfg.ssm_inner * cfg.d_model,
        "E·d",
        shape=lambda cfg: (cfg.d_model, cfg.ssm_inner),
        split=ROW,
        present=_ssm,
        layers=SSM_LAYERS,
    ),
    *_ssm_norms("rmsnorm", "RMSNorm"),
    *_ssm_norms("weightless", "weightless RMSNorm"),
)
"""A Mamba (v1) mixer layer (``MambaMixer``, models/mamba/modeling_mamba.py; ``config.SSM_FIELDS``: E channels, state
N, dt rank R, conv of K taps), in its ``parameters()`` order (the mixer's own ``A_log`` and ``D``, then its modules';
Falcon-Mamba's and Jamba's mixers add the dt/B/C norms after ``out_proj``).  Its matmul FLOPs are transformers' torch
path (no mamba_ssm / causal_conv1d kernels, no mambapy, no compiled associative scan): ``in_proj``, ``x_proj``,
``dt_proj`` (its weight applied by ``@``, booked under the mixer), ``out_proj``, the conv (``flops.ssm_conv_flops``)
and the sequential scan's read-out by C (``flops.selective_scan_flops``).  The scan's discretisation and recurrence
are elementwise: our estimate, ``SCAN_PER_STATE`` = 6 per (token, channel, state) element and ``SCAN_PER_CHANNEL`` =
9 per (token, channel) (``flops.selective_scan_elementwise``), never in the matmul totals."""


def _pattern_experts(cfg: ModelConfig) -> bool:
    return cfg.pattern_experts


_MLP2_ACTIVATION = {
    "relu": ("ReLU", fl.RELU_PER_ELEMENT),
    "relu2": ("squared ReLU", fl.RELU2_PER_ELEMENT),
    "gelu": ("GELU", fl.GELU_PER_ELEMENT),
}
"""A 2-matrix MLP's activation (``config.ARCHITECTURE_CHOICES``' ``mlp``): its name and FLOPs per element."""


def _expert_mlp(prefix: str, label: str, stacked: bool) -> tuple[Component, ...]:
    """A Nemotron-H expert MLP without gate, ``down(act(up(x)))`` of the config's 2-matrix ``mlp``: the routed
    experts (``stacked``: E stacks (E, d_e, d_in) and (E, d_in, d_e), on the T·k routed rows, over ``expert_in``
    features) or the shared expert (one ``NemotronHMLP`` of ``shared_expert_d_ff`` on every token, with biases under
    ``mlp_bias``)."""
    if stacked:
        count, width, rows, inner = (lambda cfg: cfg.num_experts), (lambda cfg: cfg.expert_width), "T·k", "d_in"

        def n_rows(z: Sizes) -> int:
            return z.T * z.cfg.experts_per_token

        def d_in(cfg: ModelConfig) -> int:
            return cfg.expert_in
    else:
        count, width, rows, inner = (lambda cfg: 1), (lambda cfg: cfg.shared_width), "T", "d"

        def n_rows(z: Sizes) -> int:
            return z.T

        def d_in(cfg: ModelConfig) -> int:
            return cfg.d_model

    E, w = ("E·", "d_e") if stacked else ("", "d_s")

    def matrix(name: str, what: str, out_first: bool) -> Component:
        def shape(cfg: ModelConfig) -> tuple[int, ...]:
            out_in = (width(cfg), d_in(cfg)) if out_first else (d_in(cfg), width(cfg))
            return (count(cfg), *out_in) if stacked else out_in

        split = (EXPERT_COL if out_first else EXPERT_ROW) if stacked else (COL if out_first else ROW)
        return Component(
            f"{prefix}.{name}",
            f"{label} {name} ({what})",
            "ffn",
            present=_pattern_experts,
            layers=MOE_LAYERS,
            params=Formula(lambda z: count(z.cfg) * d_in(z.cfg) * width(z.cfg), f"{E}{inner}·{w}"),
            flops=Formula(lambda z: fl.matmul_flops(n_rows(z), d_in(z.cfg), width(z.cfg)), f"2·{rows}·{inner}·{w}"),
            shape=shape,
            split=split,
        )

    def bias(name: str, out: Callable[[ModelConfig], int], text: str) -> Component:
        return _bias(
            f"{prefix}.{name}.bias",
            f"{label} {name} bias",
            "ffn",
            out,
            text,
            lambda cfg: cfg.pattern_experts and cfg.mlp_bias,
            MOE_LAYERS,
            COL if name == "fc" else REPLICATED,
        )

    act = Component(
        f"{prefix}.act",
        lambda cfg: f"{label} {_MLP2_ACTIVATION[cfg.mlp][0]}",
        "ffn",
        present=_pattern_experts,
        layers=MOE_LAYERS,
        elementwise=Formula(
            lambda z: _MLP2_ACTIVATION[z.cfg.mlp][1] * n_rows(z) * width(z.cfg),
            lambda cfg: f"{_MLP2_ACTIVATION[cfg.mlp][1]}·{rows}·{w}",
        ),
    )
    if stacked:  # NemotronHExperts' stacks have no bias
        return matrix("fc", "up", True), act, matrix("proj", "down", False)
    return (
        matrix("fc", "up", True),
        bias("fc", width, w),
        act,
        matrix("proj", "down", False),
        bias("proj", lambda cfg: cfg.d_model, "d"),
    )


def _latent(name: str, label: str, into: bool) -> tuple[Component, ...]:
    """Nemotron-H's latent projection before (``into``: ``fc1_latent_proj``, d -> L) or after (``fc2_latent_proj``,
    L -> d) the routed experts, on every token, with a bias under ``mlp_bias``."""
    present = lambda cfg: cfg.pattern_experts and cfg.expert_latent is not None
    out = (lambda cfg: cfg.expert_latent) if into else (lambda cfg: cfg.d_model)
    text = "d·L" if into else "L·d"
    return (
        _projection(
            f"layers.*.moe.{name}",
            label,
            "ffn",
            lambda cfg: cfg.d_model * cfg.expert_latent,
            text,
            shape=(lambda cfg: (cfg.expert_latent, cfg.d_model))
            if into
            else (lambda cfg: (cfg.d_model, cfg.expert_latent)),
            split=REPLICATED,
            present=present,
            layers=MOE_LAYERS,
        ),
        _bias(
            f"layers.*.moe.{name}.bias",
            f"{label} bias",
            "ffn",
            out,
            "L" if into else "d",
            lambda cfg: present(cfg) and cfg.mlp_bias,
            MOE_LAYERS,
            REPLICATED,
        ),
    )


PATTERN_EXPERTS: tuple[Component, ...] = (
    *_expert_mlp("layers.*.moe.experts", "routed experts", stacked=True),
    *_expert_mlp("layers.*.moe.shared", "shared expert", stacked=False),
    *_latent("latent_in", "latent projection in (fc1_latent_proj)", into=True),
    *_latent("latent_out", "latent projection out (fc2_latent_proj)", into=False),
)
"""A layer pattern's ``E`` layer (Nemotron-H's ``NemotronHMoE``, models/nemotron_h/modeling_nemotron_h.py), beside the
router: the routed experts without gate (``NemotronHExperts``: ``up_proj`` (E, d_e, d_in), ``down_proj``
(E, d_in, d_e), the config's activation, on the T·k rows routed to them), one shared expert (``shared_experts``, a
``NemotronHMLP``) and, with ``expert_latent``, the latent projections around the routed experts."""


def _gated_bias(cfg: ModelConfig) -> bool:
    return cfg.gated_mlp and cfg.mlp_bias


def _gelu_bias(cfg: ModelConfig) -> bool:
    return not cfg.gated_mlp and cfg.mlp_bias


_LN1, _LN2, _LN_FINAL, _POST, _LN_EMBED = (_norm(lambda z: z.cfg.d_model) for _ in range(5))


REGISTRY: tuple[Component, ...] = (
    Component(
        "token_embeddings",
        "token embedding",
        "embedding",
        params=Formula(lambda z: pa.embedding_params(z.cfg), "V·d"),
        shape=_shape("vocab_size", "d_model"),
        split=VOCAB,
    ),
    Component(
        "token_embeddings.scale",
        "embedding scaling ×√d (Gemma)",
        "embedding",
        present=lambda cfg: cfg.scale_embeddings,
        elementwise=Formula(lambda z: fl.embedding_scale_flops(z.T, z.cfg.d_model), "T·d"),
    ),
    Component(
        "position_embeddings",
        "learned position embedding",
        "embedding",
        present=lambda cfg: cfg.positions == "learned",
        params=Formula(lambda z: pa.position_embedding_params(z.cfg), "P·d (P = max_position_embeddings)"),
        shape=_shape("position_rows", "d_model"),
        elementwise=Formula(lambda z: fl.position_add_flops(z.T, z.cfg.d_model), "T·d", "position add"),
    ),
    Component(
        "embedding_norm",
        _norm_label("on the embeddings (BLOOM)"),
        "norms",
        present=lambda cfg: cfg.embedding_norm,
        params=_LN_EMBED[0],
        elementwise=_LN_EMBED[1],
        tensors=_norm_tensors,
        shape=_shape("d_model"),
    ),
    Component(
        "positions",
        "token positions (int64, shared)",
        "attention",
        saved=Formula(act.positions_saved_bytes, "checkpointed: 8·S; none: 0", "positions kept by the checkpoints"),
    ),
    Component("mask", "causal mask (bool, shared)", "attention", saved=Formula(act.mask_saved_bytes, "naive: S²")),
    Component(
        "layers.*.residual",
        "residual stream",
        "residual",
        saved=Formula(
            act.residual_saved_bytes,
            "none: 2·T·d·4 (fp32, amp; parallel block: T·d·4), 0 (bf16); checkpointed: T·d·e",
            "residual stream (none: kept by the norms; checkpointed: the block input)",
        ),
    ),
    Component(
        "layers.*.ln1",
        lambda cfg: f"{_norm_name(cfg)} before {'the mixer' if cfg.layer_pattern else 'attention'}",
        "norms",
        present=_pre_norms,
        params=_LN1[0],
        elementwise=_LN1[1],
        tensors=_norm_tensors,
        shape=_shape("d_model"),
        saved=Formula(act.block_norm_saved_bytes, "none: T·4 + T·d·4 + T·d·e [+ T·d·4 + d·4] (amp: T·4 + T·d·4)"),
    ),
    Component(
        "layers.*.attn.q_proj",
        "Q projection",
        "attention projections",
        present=lambda cfg: cfg.q_lora_rank is None,
        params=Formula(lambda z: pa.q_proj_params(z.cfg), "d·h·d_head"),
        shape=_shape("q_dim", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.q_proj_flops(z.cfg, z.T), "2·T·d·h·d_head"),
        saved=Formula(
            lambda z: act.projection_saved_bytes(z, "layers.*.attn.q_proj", z.cfg.q_dim),
            "amp: n_W·2 + T·d·2; selective: T·h·d_head·h",
            "Q projection (amp copies; SAC cache)",
        ),
    ),
    _bias(
        "layers.*.attn.q_proj.bias",
        "Q projection bias",
        "attention projections",
        lambda cfg: cfg.q_dim,
        "h·d_head",
        _qkv_bias,
    ),
    Component(
        "layers.*.attn.q_gate",
        "attention output gate (q_proj's second half, σ(gate) · attn)",
        "attention projections",
        present=lambda cfg: cfg.attention_output_gate,
        params=Formula(lambda z: pa.q_proj_params(z.cfg), "d·h·d_head"),
        shape=_shape("q_dim", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.q_proj_flops(z.cfg, z.T), "2·T·d·h·d_head"),
        elementwise=Formula(lambda z: fl.output_gate_flops(z.T, z.cfg.q_dim), "4·T·h·d_head", "output gate σ, ×"),
    ),
    Component(
        "layers.*.attn.k_proj",
        "K projection",
        "attention projections",
        present=_not_mla,
        params=Formula(lambda z: pa.kv_proj_params(z.cfg), "d·kv·d_head"),
        shape=_shape("kv_dim", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.kv_proj_flops(z.cfg, z.T), "2·T·d·kv·d_head"),
        saved=Formula(
            lambda z: act.projection_saved_bytes(z, "layers.*.attn.k_proj", z.cfg.kv_dim),
            "amp: n_W·2 + T·d·2; selective: T·kv·d_head·h",
            "K projection (amp copies; SAC cache)",
        ),
    ),
    _bias(
        "layers.*.attn.k_proj.bias",
        "K projection bias",
        "attention projections",
        lambda cfg: cfg.kv_dim,
        "kv·d_head",
        _qkv_bias,
    ),
    Component(
        "layers.*.attn.v_proj",
        "V projection",
        "attention projections",
        present=_not_mla,
        params=Formula(lambda z: pa.kv_proj_params(z.cfg), "d·kv·d_head"),
        shape=_shape("kv_dim", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.kv_proj_flops(z.cfg, z.T), "2·T·d·kv·d_head"),
        saved=Formula(
            lambda z: act.projection_saved_bytes(z, "layers.*.attn.v_proj", z.cfg.kv_dim),
            "amp: n_W·2 + T·d·2; selective: T·kv·d_head·h",
            "V projection (amp copies; SAC cache)",
        ),
    ),
    _bias(
        "layers.*.attn.v_proj.bias",
        "V projection bias",
        "attention projections",
        lambda cfg: cfg.kv_dim,
        "kv·d_head",
        _qkv_bias,
    ),
    _projection(
        "layers.*.attn.q_a_proj",
        "Q down-projection (MLA)",
        "attention projections",
        pa.q_a_proj_params,
        "d·r_q",
        shape=_shape("q_lora_rank", "d_model"),
        present=_q_lora,
    ),
    _rmsnorm("layers.*.attn.q_a_norm", "Q latent RMSNorm (MLA)", lambda cfg: cfg.q_lora_rank, "r_q", present=_q_lora),
    _projection(
        "layers.*.attn.q_b_proj",
        "Q up-projection (MLA)",
        "attention projections",
        pa.q_b_proj_params,
        "r_q·h·(d_nope + d_rope)",
        shape=_shape("q_dim", "q_lora_rank"),
        split=COL,
        present=_q_lora,
    ),
    _projection(
        "layers.*.attn.kv_a_proj",
        "KV down-projection + RoPE key (MLA)",
        "attention projections",
        pa.kv_a_proj_params,
        "d·(r_kv + d_rope)",
        shape=_shape("kv_cache_width", "d_model"),
        present=_mla,
    ),
    _rmsnorm("layers.*.attn.kv_a_norm", "KV latent RMSNorm (MLA)", lambda cfg: cfg.kv_lora_rank, "r_kv", present=_mla),
    _projection(
        "layers.*.attn.kv_b_proj",
        "KV up-projection (MLA)",
        "attention projections",
        pa.kv_b_proj_params,
        "r_kv·h·(d_nope + d_v)",
        shape=lambda cfg: (cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
        split=COL,
        present=_mla,
    ),
    Component(
        "layers.*.attn.output_proj",
        "output projection",
        "attention projections",
        params=Formula(lambda z: pa.output_proj_params(z.cfg), lambda cfg: f"h·{_v(cfg)}·d"),
        shape=_shape("d_model", "o_dim"),
        split=ROW,
        flops=Formula(lambda z: fl.output_proj_flops(z.cfg, z.T), lambda cfg: f"2·T·h·{_v(cfg)}·d"),
        saved=Formula(
            act.output_proj_saved_bytes, "none: T·h·d_head·h (+ amp: n_W·2); selective: T·d·h", "output projection"
        ),
    ),
    _bias(
        "layers.*.attn.output_proj.bias",
        "output projection bias",
        "attention projections",
        lambda cfg: cfg.d_model,
        "d",
        lambda cfg: cfg.output_bias,
        split=REPLICATED,
    ),
    # DeepSeek Sparse Attention's lightning indexer (transformers' DeepseekV32Indexer, registered after o_proj); its
    # forward runs under torch.no_grad(), so its parameters get no gradient and AdamW keeps no state for them: frozen
    _projection(
        "layers.*.attn.indexer.q_proj",
        "indexer Q projection (wq_b, from the Q latent)",
        "attention projections",
        pa.indexer_q_params,
        "r_q·H_I·d_I",
        shape=lambda cfg: (cfg.index_heads * cfg.index_head_dim, cfg.q_lora_rank),
        present=_indexer,
        layers=INDEXER_LAYERS,
        frozen=True,
    ),
    _projection(
        "layers.*.attn.indexer.k_proj",
        "indexer K projection (wk, one key)",
        "attention projections",
        pa.indexer_k_params,
        "d·d_I",
        shape=_shape("index_head_dim", "d_model"),
        present=_indexer,
        layers=INDEXER_LAYERS,
        frozen=True,
    ),
    Component(
        "layers.*.attn.indexer.k_norm",
        "indexer K LayerNorm",
        "norms",
        present=_indexer,
        layers=INDEXER_LAYERS,
        params=Formula(lambda z: pa.layernorm_params(z.cfg.index_head_dim), "2·d_I"),
        shape=_shape("index_head_dim"),
        tensors=lambda cfg: 2,
        elementwise=Formula(lambda z: fl.layernorm_flops(z.T, z.cfg.index_head_dim), "7·T·d_I"),
        frozen=True,
    ),
    _projection(
        "layers.*.attn.indexer.weights_proj",
        "indexer head weights (weights_proj)",
        "attention projections",
        pa.indexer_weights_params,
        "d·H_I",
        shape=_shape("index_heads", "d_model"),
        present=_indexer,
        layers=INDEXER_LAYERS,
        frozen=True,
    ),
    Component(
        "layers.*.attn.indexer.rope",
        "RoPE on the indexer's Q and K",
        "attention",
        present=_indexer,
        layers=INDEXER_LAYERS,
        elementwise=Formula(
            lambda z: fl.rope_flops(z.T, (z.cfg.index_heads + 1) * z.cfg.rope_dim), "3·T·(H_I+1)·d_rope"
        ),
    ),
    Component(
        "layers.*.attn.indexer.qk",
        "indexer scores q·kᵀ (every key)",
        "attention matmuls",
        present=_indexer,
        layers=INDEXER_LAYERS,
        flops=Formula(lambda z: fl.indexer_scores_flops(z.cfg, z.batch, z.seq), "2·B·H_I·S²·d_I"),
        elementwise=Formula(
            lambda z: fl.indexer_score_flops(z.batch * z.cfg.index_heads * z.seq * z.seq), "2·B·H_I·S²", "scale, ReLU"
        ),
    ),
    Component(
        "layers.*.attn.indexer.head_sum",
        "indexer weighted sum over heads",
        "attention matmuls",
        present=_indexer,
        layers=INDEXER_LAYERS,
        flops=Formula(lambda z: fl.indexer_head_sum_flops(z.cfg, z.batch, z.seq), "2·B·S²·H_I"),
        elementwise=Formula(lambda z: fl.bias_add_flops(z.batch * z.seq, z.seq), "B·S²", "causal mask add"),
    ),
    Component(
        "layers.*.attn.sinks",
        "attention sinks (one logit per head, gpt-oss)",
        "attention",
        present=lambda cfg: cfg.attention_sinks,
        params=Formula(lambda z: pa.sink_params(z.cfg), "h"),
        shape=lambda cfg: (cfg.num_heads,),
        split=COL,
        elementwise=Formula(
            lambda z: fl.sink_flops(z.batch, z.cfg.num_heads, z.seq), "5·B·h·S", "softmax's sink column"
        ),
    ),
    Component(
        "layers.*.attn.q_norm",
        _qk_norm_label("Q"),
        "norms",
        present=_qk_norm,
        params=Formula(lambda z: pa.qk_norm_params(z.cfg, z.cfg.num_heads), _qk_norm_text("h")),
        shape=_qk_norm_shape("num_heads"),
        tensors=_qk_norm_tensors,
        elementwise=Formula(
            lambda z: fl.qk_norm_flops(z.cfg, z.T * z.cfg.num_heads, z.cfg.d_head), _qk_norm_flops_text("h")
        ),
        saved=Formula(lambda z: act.qk_norm_saved_bytes(z, z.cfg.num_heads), "as RMSNorm, per head"),
    ),
    Component(
        "layers.*.attn.k_norm",
        _qk_norm_label("K"),
        "norms",
        present=_qk_norm,
        params=Formula(lambda z: pa.qk_norm_params(z.cfg, z.cfg.kv_heads), _qk_norm_text("kv")),
        shape=_qk_norm_shape("kv_heads"),
        tensors=_qk_norm_tensors,
        elementwise=Formula(
            lambda z: fl.qk_norm_flops(z.cfg, z.T * z.cfg.kv_heads, z.cfg.d_head), _qk_norm_flops_text("kv")
        ),
        saved=Formula(lambda z: act.qk_norm_saved_bytes(z, z.cfg.kv_heads), "as RMSNorm, per head"),
    ),
    Component(
        "layers.*.attn.rope",
        "RoPE on Q and K",
        "attention",
        present=_rope,
        elementwise=Formula(
            lambda z: fl.rope_flops(z.T, _rope_width(z.cfg)),
            lambda cfg: (
                "3·T·(h+1)·d_rope" if cfg.mla else "3·T·(h+kv)·d_rot" if cfg.partial_rotary else "3·T·(h+kv)·d_head"
            ),
        ),
        saved=Formula(act.rope_saved_bytes, "none: T·(h+kv)·d_head·h + 2·S·d_head·h", "rotated Q, K and cos/sin rows"),
    ),
    Component(
        "layers.*.attn.qk",
        "attention QKᵀ",
        "attention matmuls",
        flops=Formula(lambda z: fl.attention_scores_flops(z.cfg, z.batch, z.seq), "2·B·h·S²·d_head"),
        saved=Formula(act.qk_saved_bytes, "selective, naive: B·h·S²·h", "QKᵀ scores (SAC cache)"),
    ),
    Component(
        "layers.*.attn.scale",
        "score scaling 1/√d_head",
        "attention",
        elementwise=Formula(lambda z: fl.score_scale_flops(z.score_count), "B·h·S²"),
    ),
    Component(
        "layers.*.attn.alibi",
        "ALiBi bias add (m_head · key position)",
        "attention",
        present=lambda cfg: cfg.positions == "alibi",
        elementwise=Formula(lambda z: fl.alibi_flops(z.score_count), "B·h·S²"),
    ),
    Component(
        "layers.*.attn.softmax",
        "softmax",
        "attention",
        elementwise=Formula(lambda z: fl.softmax_flops(z.score_count), "5·B·h·S²"),
        saved=Formula(act.softmax_saved_bytes, "none, naive: B·h·S²·e + B·h·S·e", "softmax: exp and row sums"),
    ),
    Component(
        "layers.*.attn.av",
        "attention AV",
        "attention matmuls",
        flops=Formula(lambda z: fl.attention_values_flops(z.cfg, z.batch, z.seq), lambda cfg: f"2·B·h·S²·{_v(cfg)}"),
        saved=Formula(
            act.av_saved_bytes, "none: B·h·S²·h + T·kv·d_head·h; selective: T·h·d_head·h", "AV: probabilities and V"
        ),
    ),
    Component(
        "layers.*.attn.sdpa",
        "fused attention (sdpa)",
        "attention",
        saved=Formula(
            act.sdpa_saved_bytes,
            "none: T·h·d_head·h + B·h·S·4 + T·kv·d_head·h; selective: T·h·d_head·h + B·h·S·4",
            "fused attention: output, logsumexp (and V)",
        ),
    ),
    *GATED_DELTANET,
    *MAMBA2,
    *SHORT_CONV,
    *MAMBA1,
    Component(
        "layers.*.post_attn_norm",
        _norm_label("after attention (sandwich/post)"),
        "norms",
        present=_post_norms,
        params=_POST[0],
        elementwise=_POST[1],
        tensors=_norm_tensors,
        shape=_shape("d_model"),
    ),
    Component(
        "layers.*.residual.attn",
        "residual add (attention)",
        "residual",
        elementwise=Formula(lambda z: fl.residual_add_flops(z.T, z.cfg.d_model), "T·d"),
    ),
    Component(
        "layers.*.ln2",
        _norm_label("before FFN"),
        "norms",
        present=lambda cfg: cfg.pre_norms and cfg.parallel_block != "one_norm" and _two_sublayers(cfg),
        # one_norm: ln1 feeds the FFN; a layer pattern's block has one norm, ln1 (Bamba's has two)
        params=_LN2[0],
        elementwise=_LN2[1],
        tensors=_norm_tensors,
        shape=_shape("d_model"),
        saved=Formula(act.block_norm_saved_bytes, "as ln1"),
    ),
    Component(
        "layers.*.ffn.w1",
        "FFN W1 (gate)",
        "ffn",
        layers=DENSE_LAYERS,
        present=_gated,
        params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d·d_ff"),
        shape=_shape("d_ff", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d·d_ff"),
        saved=Formula(lambda z: act.ffn_saved_bytes(z, "w1"), "T·d_ff·h (+ amp: n_W·2 + T·d·2)", "FFN W1"),
    ),
    _bias("layers.*.ffn.w1.bias", "FFN W1 bias", "ffn", lambda cfg: cfg.d_ff, "d_ff", _gated_bias, DENSE_LAYERS),
    Component(
        "layers.*.ffn.w2",
        "FFN W2 (down)",
        "ffn",
        layers=DENSE_LAYERS,
        present=_gated,
        params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d_ff·d"),
        shape=_shape("d_model", "d_ff"),
        split=ROW,
        flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d_ff·d"),
        saved=Formula(lambda z: act.ffn_saved_bytes(z, "w2"), "amp: n_W·2; selective: T·d·h", "FFN W2"),
    ),
    _bias(
        "layers.*.ffn.w2.bias",
        "FFN W2 bias",
        "ffn",
        lambda cfg: cfg.d_model,
        "d",
        _gated_bias,
        DENSE_LAYERS,
        REPLICATED,
    ),
    Component(
        "layers.*.ffn.w3",
        "FFN W3 (up)",
        "ffn",
        layers=DENSE_LAYERS,
        present=_gated,
        params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d·d_ff"),
        shape=_shape("d_ff", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d·d_ff"),
        saved=Formula(lambda z: act.ffn_saved_bytes(z, "w3"), "T·d_ff·h (+ amp: n_W·2 + T·d·2)", "FFN W3"),
    ),
    _bias("layers.*.ffn.w3.bias", "FFN W3 bias", "ffn", lambda cfg: cfg.d_ff, "d_ff", _gated_bias, DENSE_LAYERS),
    Component(
        "layers.*.ffn.fc",
        lambda cfg: f"FFN fc (up, {MLP_NAMES[cfg.mlp]})",
        "ffn",
        layers=DENSE_LAYERS,
        present=_gelu_mlp,
        params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d·d_ff"),
        shape=_shape("d_ff", "d_model"),
        split=COL,
        flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d·d_ff"),
    ),
    _bias("layers.*.ffn.fc.bias", "FFN fc bias", "ffn", lambda cfg: cfg.d_ff, "d_ff", _gelu_bias, DENSE_LAYERS),
    Component(
        "layers.*.ffn.proj",
        lambda cfg: f"FFN proj (down, {MLP_NAMES[cfg.mlp]})",
        "ffn",
        layers=DENSE_LAYERS,
        present=_gelu_mlp,
        params=Formula(lambda z: pa.ffn_matrix_params(z.cfg), "d_ff·d"),
        shape=_shape("d_model", "d_ff"),
        split=ROW,
        flops=Formula(lambda z: fl.ffn_matrix_flops(z.cfg, z.T), "2·T·d_ff·d"),
    ),
    _bias(
        "layers.*.ffn.proj.bias",
        "FFN proj bias",
        "ffn",
        lambda cfg: cfg.d_model,
        "d",
        _gelu_bias,
        DENSE_LAYERS,
        REPLICATED,
    ),
    Component(
        "layers.*.ffn.silu",
        "SiLU",
        "ffn",
        layers=DENSE_LAYERS,
        present=lambda cfg: cfg.mlp == "swiglu",
        elementwise=Formula(lambda z: fl.silu_flops(z.T, z.cfg.d_ff), "4·T·d_ff"),
        saved=Formula(lambda z: act.ffn_saved_bytes(z, "silu"), "none: 2·T·d_ff·h", "sigmoid and SiLU outputs"),
    ),
    Component(
        "layers.*.ffn.gelu",
        "GELU (tanh approximation)",
        "ffn",
        layers=DENSE_LAYERS,
        present=lambda cfg: cfg.mlp in ("geglu", "gelu"),
        elementwise=Formula(lambda z: fl.gelu_flops(z.T, z.cfg.d_ff), "9·T·d_ff"),
    ),
    Component(
        "layers.*.ffn.relu",
        "ReLU",
        "ffn",
        layers=DENSE_LAYERS,
        present=lambda cfg: cfg.mlp == "relu",
        elementwise=Formula(lambda z: fl.relu_flops(z.T, z.cfg.d_ff), "T·d_ff"),
    ),
    Component(
        "layers.*.ffn.relu2",
        "squared ReLU",
        "ffn",
        layers=DENSE_LAYERS,
        present=lambda cfg: cfg.mlp == "relu2",
        elementwise=Formula(lambda z: fl.relu_flops(z.T, z.cfg.d_ff, squared=True), "2·T·d_ff"),
    ),
    Component(
        "layers.*.ffn.gate",
        "gating product",
        "ffn",
        layers=DENSE_LAYERS,
        present=_gated,
        elementwise=Formula(lambda z: fl.gate_flops(z.T, z.cfg.d_ff), "T·d_ff"),
        saved=Formula(lambda z: act.ffn_saved_bytes(z, "gate"), "none: T·d_ff·h", "gated product"),
    ),
    _projection(
        "layers.*.moe.router",
        "MoE router",
        "ffn",
        pa.router_params,
        "d·E",
        shape=_shape("num_experts", "d_model"),
        present=_moe,
        layers=MOE_LAYERS,
        saved=Formula(
            act.moe_router_saved_bytes, "amp: E·d·2 + T·d·2; selective: T·E·h", "MoE router (amp copies; SAC cache)"
        ),
    ),
    _bias(
        "layers.*.moe.router.bias",
        "MoE router bias",
        "ffn",
        lambda cfg: cfg.num_experts,
        "E",
        lambda cfg: cfg.router_bias,
        MOE_LAYERS,
        REPLICATED,
    ),
    Component(
        "layers.*.moe.score_bias",
        "router score bias (frozen, Ernie 4.5)",
        "ffn",
        present=lambda cfg: cfg.router_score_bias,
        layers=MOE_LAYERS,
        params=Formula(lambda z: z.cfg.num_experts, "E (no gradient)"),
        elementwise=Formula(lambda z: fl.bias_add_flops(z.T, z.cfg.num_experts), "T·E"),
        shape=lambda cfg: (cfg.num_experts,),
        frozen=True,
    ),
    Component(
        "layers.*.moe.router.scores",
        "router scores (softmax or sigmoid over E)",
        "ffn",
        present=_moe,
        layers=MOE_LAYERS,
        elementwise=Formula(lambda z: fl.softmax_flops(z.T * z.cfg.num_experts), "5·T·E"),
        saved=Formula(
            act.moe_scores_saved_bytes, "none: T·E·e + T·e + T·k·8", "router softmax (exp, row sums) and top-k indices"
        ),
    ),
    *_expert_swiglu(
        "layers.*.moe.experts",
        "routed experts",
        lambda cfg: cfg.expert_width,
        lambda z: fl.expert_rows(z.cfg, z.T),
        "d_e",
        lambda cfg: "T·E" if cfg.all_experts_run else "T·k",  # Llama 4: every expert on every token
        lambda cfg: cfg.moe and not cfg.pattern_experts,  # Nemotron-H's E layers: ``PATTERN_EXPERTS``
        lambda cfg: cfg.num_experts,
        "E·",
        act.moe_experts_saved_bytes,
        {
            "w1": "none: T·k·d_e·h + T·k·d·e (the repeated rows; amp: T·k·d·2 + n_W·2); selective: T·k·d_e·h",
            "w3": "none: T·k·d_e·h (+ amp: T·k·d·2 + n_W·2); selective: T·k·d_e·h",
            "w2": "amp: n_W·2 (n_W: the experts that ran); selective: T·k·d·h",
            "silu": "none: 2·T·k·d_e·h",
            "gate": "none: T·k·d_e·h",
        },
        stacked=True,
    ),
    *_expert_swiglu(
        "layers.*.moe.shared",
        "shared experts",
        lambda cfg: cfg.shared_width,
        lambda z: z.T,
        "n_s·d_s",
        "T",
        lambda cfg: cfg.moe and cfg.shared_experts > 0 and not cfg.pattern_experts,
        lambda cfg: 1,
        "",
        act.moe_shared_saved_bytes,
        {
            "w1": "none: T·n_s·d_s·h (+ amp: n_W·2 + T·d·2); selective: T·n_s·d_s·h",
            "w3": "none: T·n_s·d_s·h (+ amp: n_W·2 + T·d·2); selective: T·n_s·d_s·h",
            "w2": "amp: n_W·2; selective: T·d·h",
            "silu": "none: 2·T·n_s·d_s·h",
            "gate": "none: T·n_s·d_s·h",
        },
        stacked=False,
    ),
    *PATTERN_EXPERTS,
    _projection(
        "layers.*.moe.shared_gate",
        "shared-expert gate σ(x·w) (Qwen2-MoE)",
        "ffn",
        pa.shared_gate_params,
        "d",
        shape=lambda cfg: (1, cfg.d_model),
        present=lambda cfg: cfg.shared_expert_gate,
        layers=MOE_LAYERS,
        elementwise=Formula(lambda z: fl.shared_gate_flops(z.T, z.cfg.d_model), "3·T + T·d", "shared-expert gate σ, ×"),
    ),
    Component(
        "layers.*.moe.combine",
        "expert outputs × router weights, summed",
        "ffn",
        present=_moe,
        layers=MOE_LAYERS,
        elementwise=Formula(
            lambda z: fl.expert_combine_flops(z.T, z.cfg),
            lambda cfg: f"2·T·{'E' if cfg.all_experts_run else 'k'}·d" + (" + T·d" if cfg.shared_experts else ""),
        ),
        saved=Formula(act.moe_combine_saved_bytes, "none: T·k·d·h + T·k·e", "routed outputs and top-k weights"),
    ),
    Component(
        "layers.*.post_ffn_norm",
        _norm_label("after FFN (sandwich/post)"),
        "norms",
        present=_post_norms,
        params=_POST[0],
        elementwise=_POST[1],
        tensors=_norm_tensors,
        shape=_shape("d_model"),
    ),
    Component(
        "layers.*.residual.ffn",
        "residual add (FFN)",
        "residual",
        present=_two_sublayers,  # a layer pattern's block has one residual add (Bamba's has two)
        elementwise=Formula(lambda z: fl.residual_add_flops(z.T, z.cfg.d_model), "T·d"),
    ),
    Component(
        "ln_final",
        lambda cfg: f"final {_norm_name(cfg)}",
        "norms",
        params=_LN_FINAL[0],
        elementwise=_LN_FINAL[1],
        tensors=_norm_tensors,
        shape=_shape("d_model"),
        saved=Formula(act.final_norm_saved_bytes, "as ln1 under none (+ its fp32 input)"),
    ),
    Component(
        "lm_head",
        _lm_head_label,
        "lm head",
        params=Formula(lambda z: pa.lm_head_params(z.cfg), "d·V (0 when tied)"),
        shape=_shape("vocab_size", "d_model"),
        split=VOCAB,
        flops=Formula(lambda z: fl.lm_head_flops(z.cfg, z.T), "2·T·d·V"),
        saved=Formula(act.lm_head_saved_bytes, "amp: V·d·2 + T·d·2", "LM head (amp copies)"),
    ),
    _bias(
        "lm_head.bias",
        "LM head bias",
        "lm head",
        lambda cfg: cfg.vocab_size,
        "V",
        lambda cfg: cfg.lm_head_bias,
        split=VOCAB,
    ),
    Component(
        "cross_entropy",
        "cross-entropy",
        "loss",
        saved=Formula(act.cross_entropy_saved_bytes, "2·T·V·e + T·e + e", "cross-entropy (z, exp z, row sums, loss)"),
    ),
)
"""Every component, in the live model's module order (see the module docstring)."""
REGISTRY = tuple(
    dataclasses.replace(c, layers=ATTENTION_LAYERS)
    if c.key.startswith("layers.*.attn.") and c.layers is EVERY_LAYER
    else c
    for c in REGISTRY
)  # the attention components occur in the attention layers (all but a hybrid's Gated DeltaNet layers)

FLOP_GROUPS = tuple(dict.fromkeys(c.group for c in REGISTRY if c.flops))
"""The groups of the forward matmul FLOPs, in order: attention projections, attention matmuls, ffn, lm head."""


def component(key: str) -> Component:
    """The registry entry with this key."""
    for c in REGISTRY:
        if c.key == key:
            return c
    raise KeyError(key)


def components(cfg: ModelConfig, quantity: str) -> list[Component]:
    """The components of ``cfg`` that contribute to ``quantity``, in registry order."""
    return [c for c in REGISTRY if getattr(c, quantity) is not None and c.present(cfg)]


def breakdown(quantity: str, z: Sizes) -> Breakdown:
    """One quantity, per component: a per-layer component's total is L × its per-layer value."""
    title, unit = QUANTITIES[quantity]
    items = []
    for c in components(z.cfg, quantity):
        formula: Formula = getattr(c, quantity)
        L = c.layers.count(z.cfg)
        if c.per_layer and not L:
            continue  # e.g. the dense FFN of a model whose every layer is a mixture of experts
        n = formula.fn(z)
        if quantity == "saved" and n == 0:
            continue  # kept nothing under this setup (e.g. the mask with sdpa, every norm when checkpointed)
        label = formula.label or (c.label(z.cfg) if callable(c.label) else c.label)
        text = formula.text(z.cfg) if callable(formula.text) else formula.text
        if c.per_layer:
            symbol = "L" if L == z.cfg.num_layers else c.layers.symbol
            items.append(Item(c.key, label, c.group, n * L, n, f"{symbol}·({text})"))
        else:
            items.append(Item(c.key, label, c.group, n, None, text))
    return Breakdown(title, unit, tuple(items))
