"""Absolute figures worked out by hand: the KV cache (GQA) and the non-matmul FLOP estimate.

Each expected number is arithmetic written out in the test from a model's public shape,
never a value read off lm_accounting's output.  Each test also says which plausible bug it
would catch (query heads instead of KV heads, d_model instead of kv·head_dim, a missing
factor 2 for K and V, a wrong per-element constant, a wrong element count).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lm_accounting.analytic.flops import forward_flops, nonmatmul_flops
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.config import ModelConfig, load_config
from lm_accounting.model import build_model, random_tokens

# -- KV cache: 2 (K and V) · layers · kv_heads · head_dim · tokens · batch · bytes ----------------


def test_kv_cache_llama3_8b_bf16_full_context():
    # Llama-3-8B (params.json): 32 layers, 32 query heads but 8 KV heads, head_dim 4096/32 = 128.
    # S = 8192, B = 1, bf16 = 2 bytes:
    #   2 · 32 · 8 · 128 · 8192 · 2
    #   = 64 · 8 = 512;  512 · 128 = 65,536;  65,536 · 8192 = 536,870,912;  · 2 = 1,073,741,824
    # = exactly 1 GiB (2³⁰).  With the 32 query heads it would be 4 GiB; with d_model (4096)
    # as the K/V width also 4 GiB; without the factor 2 for K and V, 0.5 GiB.
    cfg = load_config("llama-3-8b")
    assert kv_cache_bytes(cfg, 8192, 1, "bf16") == 1_073_741_824 == 2**30
    # per token: 2 · 32 · 8 · 128 · 2 = 131,072 B = 128 KiB
    assert kv_cache_bytes(cfg, 1, 1, "bf16") == 131_072
    # fp32, batch 4, 1,000 tokens: 2 · 32 · 8 · 128 · 1000 · 4 · 4 = 65,536 · 16,000 = 1,048,576,000
    assert kv_cache_bytes(cfg, 1000, 4, "fp32") == 1_048_576_000


def test_kv_cache_qwen3_0_6b_explicit_head_dim():
    # Qwen3-0.6B (config.json): 28 layers, 16 query heads, 8 KV heads, explicit head_dim 128
    # (16 · 128 = 2048 != d_model 1024).  Its full context, S = 40,960, B = 1, bf16:
    #   2 · 28 · 8 · 128 · 40960 · 2
    #   = 56 · 8 = 448;  448 · 128 = 57,344;  57,344 · 40,960 = 2,348,810,240;  · 2 = 4,697,620,480
    # Query heads (16) would double it: 9,395,240,960.
    cfg = load_config("qwen3-0.6b")
    assert kv_cache_bytes(cfg, 40960, 1, "bf16") == 4_697_620_480
    # per token: 2 · 28 · 8 · 128 · 2 = 114,688 B (112 KiB)
    assert kv_cache_bytes(cfg, 1, 1, "bf16") == 114_688


def test_kv_cache_gqa_where_every_width_differs():
    # d_model 40, 10 query heads, 2 KV heads, head_dim 6: kv·hd = 12, h·hd = 60, d = 40, d/h = 4.
    # 3 layers, S = 7, B = 5, fp32:  2 · 3 · 2 · 6 · 7 · 5 · 4 = 72 · 140 = 10,080
    # (query heads: 50,400; d_model: 33,600; d_model/h as head_dim: 6,720)
    cfg = ModelConfig(
        vocab_size=50, context_length=16, num_layers=3, d_model=40, num_heads=10, num_kv_heads=2, head_dim=6, d_ff=24
    )
    assert kv_cache_bytes(cfg, 7, 5, "fp32") == 10_080
    assert kv_cache_bytes(cfg, 7, 5, "bf16") == 5_040


def test_kv_cache_mha_gpt2_xl():
    # GPT-2 XL, plain MHA: 48 layers, 25 heads of 64 (= d_model 1600).  S = 1024, B = 4, fp32:
    #   2 · 48 · 25 · 64 · 1024 · 4 · 4
    #   = 96 · 1600 = 153,600;  · 1024 = 157,286,400;  · 4 = 629,145,600;  · 4 B = 2,516,582,400
    cfg = load_config("gpt2-xl")
    assert kv_cache_bytes(cfg, 1024, 4, "fp32") == 2_516_582_400


# -- non-matmul FLOPs ------------------------------------------------------------------------
# The convention (analytic/flops.py, one FLOP per arithmetic op; exp, rsqrt, sigmoid and a
# max-compare count 1 each), re-derived here:
#   RMSNorm per element: x², sum into the mean, ·rsqrt(mean + eps), ·gain          -> 4
#   RoPE per element:    x_e·cos, x_o·sin, subtract (or add)                        -> 3
#   score scaling:       one multiply by 1/√d_head per score                        -> 1
#   softmax per score:   max-compare, subtract max, exp, add to the sum, divide     -> 5
#   SiLU per element:    exp(-x), 1 + ·, x / ·  (σ), then x·σ ... counted as 4
#   gating per element:  SiLU(W1x) ⊙ W3x                                            -> 1
#   residual per element: x + f(x)                                                  -> 1
#
# Tiny config: L = 2, d = 8, h = 4, kv = 2, head_dim = 6 (q width 24, kv width 12), d_ff = 12,
# qk-norm on; B = 3, S = 5, so T = 15 tokens and B·h·S² = 3·4·25 = 300 scores per layer.
HAND = ModelConfig(
    vocab_size=11,
    context_length=8,
    num_layers=2,
    d_model=8,
    num_heads=4,
    num_kv_heads=2,
    head_dim=6,
    d_ff=12,
    qk_norm=True,
)
HAND_PER_LAYER = {
    "layers.*.ln1": 4 * 15 * 8,  # 480
    "layers.*.attn.q_norm": 4 * 15 * 24,  # 1,440 (per-head RMSNorm over the 4 · 6 = 24 query values)
    "layers.*.attn.k_norm": 4 * 15 * 12,  # 720 (over the 2 · 6 = 12 key values)
    "layers.*.attn.rope": 3 * 15 * (24 + 12),  # 3 · 15 · 36 = 1,620
    "layers.*.attn.scale": 1 * 300,  # 300
    "layers.*.attn.softmax": 5 * 300,  # 1,500
    "layers.*.residual.attn": 1 * 15 * 8,  # 120
    "layers.*.ln2": 4 * 15 * 8,  # 480
    "layers.*.ffn.silu": 4 * 15 * 12,  # 720
    "layers.*.ffn.gate": 1 * 15 * 12,  # 180
    "layers.*.residual.ffn": 1 * 15 * 8,  # 120
}
# 480 + (1440 + 720) + 1620 + 300 + 1500 + 120 + 480 + 720 + 180 + 120 = 7,680 per layer;
# two layers 15,360, plus the final RMSNorm 4 · 15 · 8 = 480: 15,840.


def per_layer_items(breakdown):
    """{key: per-layer count}, with a combined ``attn.qk_norm`` item split into q and k if need be."""
    items = {it.key: it.per_layer for it in breakdown if it.per_layer is not None}
    if "layers.*.attn.qk_norm" in items:  # older layout: one item for both norms
        both = items.pop("layers.*.attn.qk_norm")
        items["layers.*.attn.q_norm"], items["layers.*.attn.k_norm"] = both * 24 // 36, both * 12 // 36
    return items


def test_nonmatmul_components_by_hand():
    assert sum(HAND_PER_LAYER.values()) == 7_680  # the hand sum above
    nm = nonmatmul_flops(HAND, 5, 3)
    assert per_layer_items(nm) == HAND_PER_LAYER  # every component, and nothing else per layer
    for item in nm:
        if item.per_layer is not None:
            assert item.total == 2 * item.per_layer, item.key
    assert nm["ln_final"].total == 480 and nm["ln_final"].per_layer is None
    assert [it.key for it in nm if it.per_layer is None] == ["ln_final"]
    assert nm.total == 15_840


def test_nonmatmul_without_qk_norm_and_mha():
    # GPT-2 small, S = 1024, B = 1: L = 12, d = 768, h = 12, head_dim 64, d_ff 3072, T = 1024.
    #   norms 2 · 4 · 1024 · 768 = 6,291,456;  RoPE 3 · 1024 · (768 + 768) = 4,718,592
    #   scores 12 · 1024² = 12,582,912: scale 12,582,912, softmax 62,914,560
    #   residuals 2 · 1024 · 768 = 1,572,864;  SiLU 4 · 1024 · 3072 = 12,582,912;  gate 3,145,728
    #   per layer: 6,291,456 + 4,718,592 + 12,582,912 + 62,914,560 + 1,572,864 + 12,582,912
    #              + 3,145,728 = 103,809,024;  12 layers: 1,245,708,288
    #   ln_final 4 · 1024 · 768 = 3,145,728;  total 1,248,854,016
    nm = nonmatmul_flops(load_config("gpt2-small"), 1024)
    assert not any("norm" in key for key in per_layer_items(nm))  # ln1 and ln2 only: no qk-norm
    assert nm["layers.*.attn.rope"].per_layer == 4_718_592
    assert nm["layers.*.attn.softmax"].per_layer == 62_914_560
    assert nm.per_layer_total == 103_809_024
    assert nm.total == 1_248_854_016


def test_nonmatmul_is_never_in_the_matmul_total():
    # GPT-2 XL at 1,024 tokens: the published matmul total 4,513,336,524,800 (transformer_accounting
    # (b)) holds whatever the elementwise estimate is.
    cfg = load_config("gpt2-xl")
    assert forward_flops(cfg, 1024).total == 4_513_336_524_800
    assert "elementwise" not in forward_flops(cfg, 1024).groups()


class _OutputNumel(TorchDispatchMode):
    """Records (op name, output shape) of every aten op the live model runs."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.calls.append((func.overloadpacket.__name__, tuple(out.shape)))
        return out

    def numel(self, op, shape=None):
        return sum(torch.Size(s).numel() for name, s in self.calls if name == op and (shape is None or s == shape))


def test_nonmatmul_element_counts_are_what_the_live_model_computes():
    """The element counts behind each estimate equal the elements the live model's ops produce.

    The per-element constants are conventions; the element counts are not.  Count them on
    the live model (meta, forward only, no loss) by the outputs of the op that is unique to
    each piece: x.pow(2) in every RMSNorm, the stacked RoPE halves, exp in softmax, sigmoid in
    SiLU, the (B,S,d_ff) products (SiLU's x·σ and the gate), the (B,S,d) residual adds.
    """
    cfg, B, S = HAND, 3, 5
    model = build_model(cfg, device="meta")
    tokens = random_tokens(cfg, B, S, device="meta")
    with torch.no_grad(), _OutputNumel() as rec:
        model(tokens)
    nm = nonmatmul_flops(cfg, S, B)
    norms = 2 * sum(v for k, v in per_layer_items(nm).items() if k.endswith(("ln1", "ln2", "q_norm", "k_norm")))
    norms += nm["ln_final"].total
    # 2 layers · (15·8 + 15·8 + 15·36) + 15·8 = 2 · 780 + 120 = 1,680 normalised elements
    assert rec.numel("pow") == 1_680 == norms // 4
    assert rec.numel("stack") == 2 * 15 * 36 == nm["layers.*.attn.rope"].total // 3  # 1,080
    assert rec.numel("exp") == 2 * 300 == nm["layers.*.attn.softmax"].total // 5  # 600
    assert rec.numel("exp") == nm["layers.*.attn.scale"].total
    assert rec.numel("sigmoid") == 2 * 15 * 12 == nm["layers.*.ffn.silu"].total // 4  # 360
    # mul outputs of shape (B, S, d_ff): SiLU's x·σ(x) and the gate, per layer
    assert rec.numel("mul", (B, S, 12)) == 2 * 360 == nm["layers.*.ffn.silu"].total // 4 + nm["layers.*.ffn.gate"].total
    residual = nm["layers.*.residual.attn"].total + nm["layers.*.residual.ffn"].total
    assert rec.numel("add", (B, S, 8)) == 4 * 120 == residual  # two residual adds per layer


@pytest.mark.parametrize("seq,batch", [(0, 1), (1, 0)])
def test_hand_count_inputs_are_checked(seq, batch):
    from lm_accounting.config import AccountingError

    with pytest.raises(AccountingError):
        nonmatmul_flops(HAND, seq, batch)
