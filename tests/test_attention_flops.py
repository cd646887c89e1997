"""Fused attention is counted (not a silent 0), and a whole training step under every setup counts
exactly the predicted hardware FLOPs (lm_accounting.analytic.hardware_flops)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.hardware_flops import step_flops as predicted
from lm_accounting.config import ModelConfig
from lm_accounting.measure import attention_flops
from lm_accounting.measure.step import step_flops as measured
from lm_accounting.model import FusedAttention, build_model, random_tokens, scaled_dot_product_attention
from lm_accounting.setup import TrainingSetup, every_setup

TINY = ModelConfig(vocab_size=97, context_length=16, num_layers=2, d_model=32, num_heads=4, d_ff=64, name="tiny")
TINY_GQA = dataclasses.replace(
    TINY, num_heads=6, num_kv_heads=2, head_dim=8, qk_norm=True, tie_embeddings=True, name="tiny-gqa"
)
B, S = 2, 16


def test_install_registers_both_cpu_ops_once():
    attention_flops.install()
    attention_flops.install()  # idempotent
    assert attention_flops.CPU_FLASH in flop_registry and attention_flops.CPU_FLASH_BACKWARD in flop_registry


def fwd_bwd_flops(fn, b, h, kv, s, d) -> tuple[int, int]:
    """FlopCounterMode's forward and backward FLOPs of one attention call on meta."""
    attention_flops.install()
    q = torch.empty(b, h, s, d, device="meta", requires_grad=True)
    k, v = (torch.empty(b, kv, s, d, device="meta", requires_grad=True) for _ in "kv")
    with FlopCounterMode(display=False) as fwd:
        out = fn(q, k, v)
    with FlopCounterMode(display=False) as bwd:
        out.backward(torch.empty_like(out))
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("b, h, kv, s, d", [(2, 4, 4, 16, 8), (3, 6, 2, 24, 16), (1, 8, 1, 5, 4)])
def test_fused_counts_the_square_and_one_score_recompute(b, h, kv, s, d):
    """Hand counts, 2 FLOPs per MAC over the full s×s square, K/V broadcast to h heads:
    forward 1. QKᵀ 2·b·h·s·s·d + 2. AV 2·b·h·s·s·d = 4·b·h·s²·d, equal to the naive model's;
    backward: naive autograd 4 matmuls (dP, dV, dQ, dK) = 8·b·h·s²·d; the fused backward adds
    the recompute of QKᵀ: 10·b·h·s²·d."""
    fused = fwd_bwd_flops(FusedAttention(), b, h, kv, s, d)
    mask = torch.ones(s, s, dtype=torch.bool, device="meta").tril()
    naive = fwd_bwd_flops(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask), b, h, kv, s, d)
    assert fused == (4 * b * h * s * s * d, 10 * b * h * s * s * d)
    assert naive == (4 * b * h * s * s * d, 8 * b * h * s * s * d)


@pytest.mark.parametrize("cfg", [TINY, TINY_GQA], ids=lambda c: c.name)
def test_sdpa_forward_equals_naive_qk_plus_av_in_both_counters(cfg):
    from fvcore.nn import FlopCountAnalysis

    attention_flops.install()
    analytic = forward_flops(cfg, S, B)
    qk_av = analytic["layers.*.attn.qk"].per_layer + analytic["layers.*.attn.av"].per_layer
    model = build_model(cfg, "meta", setup=TrainingSetup(attention="sdpa"))
    tokens = random_tokens(cfg, B, S, "meta")
    with FlopCounterMode(display=False) as counter:
        model(tokens)
    counts = counter.get_flop_counts()
    assert counter.get_total_flops() == analytic.total
    analysis = FlopCountAnalysis(model, (tokens,)).set_op_handle(**attention_flops.FVCORE_HANDLES)
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    by_module = analysis.by_module()
    for i in range(cfg.num_layers):
        assert sum(counts[f"TransformerLM.layers.{i}.attn.sdpa"].values()) == qk_av
        assert 2 * by_module[f"layers.{i}.attn.sdpa"] == qk_av
    assert 2 * analysis.total() == analytic.total
    assert not any("scaled_dot_product" in op for op in analysis.unsupported_ops())


def test_hardware_flops_by_hand():
    """TINY (d 32, h 4, d_head 8, d_ff 64, V 97, 2 layers) at B=2, S=16, T=32 tokens, per layer:
    q,k,v,o 4·2·32·32·32 = 262,144; qk = av = 2·2·4·16·16·8 = 32,768; w1,w2,w3 3·2·32·32·64 = 393,216;
    so a layer is 720,896, w2 131,072; LM head 2·32·32·97 = 198,656; F = 2·720,896 + 198,656 = 1,640,448.
    torchtitan's per-op SAC (``op``): of the mms q k v o w1 w3 w2 it reruns the 2nd, 4th, 6th, k + o + w3 =
    65,536 + 65,536 + 131,072 = 262,144 a layer, and naive attention's QKᵀ and AV (bmm, not in its save list)."""
    forward, layer, w2, qk = 1_640_448, 720_896, 131_072, 32_768
    op = 65_536 + 65_536 + 131_072
    for setup, recompute, attn in [
        (TrainingSetup(), 0, 0),
        (TrainingSetup(checkpoint="full"), 2 * (layer - w2), 0),
        (TrainingSetup(checkpoint="selective"), 0, 0),
        (TrainingSetup(attention="sdpa"), 0, 2 * qk),
        (TrainingSetup(attention="sdpa", checkpoint="full"), 2 * (layer - w2), 2 * qk),
        (TrainingSetup(checkpoint="op"), 2 * (op + 2 * qk), 0),
        (TrainingSetup(attention="sdpa", checkpoint="op"), 2 * op, 2 * qk),
    ]:
        p = predicted(TINY, S, B, setup)
        assert (p.forward, p.model, p.recompute, p.attention_recompute) == (forward, 3 * forward, recompute, attn)
        assert p.hardware == 3 * forward + recompute + attn


@pytest.mark.grid
@pytest.mark.parametrize("setup", list(every_setup()), ids=lambda s: s.label)
def test_whole_step_counts_the_predicted_hardware_flops(setup):
    """FlopCounterMode over forward + loss + backward (+ recompute) + AdamW on meta = hardware_flops,
    exactly; without checkpointing and with naive attention that is 3 × forward."""
    for cfg in (TINY, TINY_GQA):
        p = predicted(cfg, S, B, setup)
        assert measured(cfg, S, B, setup) == p.hardware
        if setup.checkpoint in ("none", "selective") and setup.attention == "naive":
            assert p.hardware == p.model == 3 * forward_flops(cfg, S, B).total


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "deepseek_v3", "mixtral", "glm4_moe"])
def test_op_checkpointing_counts_the_predicted_hardware_flops(arch):
    """torchtitan's per-op SAC beyond the Llama block: a 2-matrix GELU MLP, latent attention with a dense first
    layer and shared experts (each block kind numbers its own mms), routed experts (``bmm``: all rerun, the
    last one too without shared experts): FlopCounterMode over the whole step = ``hardware_flops``."""
    from test_ops_course import NAIVE_ONLY, config

    for attention in ("naive",) if arch in NAIVE_ONLY else ("naive", "sdpa"):
        setup = TrainingSetup(attention=attention, checkpoint="op")
        assert measured(config(arch), 8, 2, setup) == predicted(config(arch), 8, 2, setup).hardware


def test_whole_step_at_a_larger_shape():
    """A 4-layer GQA model at 128 tokens, batch 3, sdpa + full checkpointing + amp, for-loop AdamW."""
    cfg = dataclasses.replace(TINY_GQA, num_layers=4, context_length=128)
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16", optimizer="for-loop")
    assert measured(cfg, 128, 3, setup) == predicted(cfg, 128, 3, setup).hardware


def test_our_formulas_by_hand_with_grouped_heads():
    """b 3, h 6 query heads over 2 K/V heads, s_q 24, s_k 24, d 16: forward 4·b·h·s_q·s_k·d, backward
    10·b·h·s_q·s_k·d (K/V broadcast to the 6 query heads), and torch 2.13's own helpers agree."""
    from torch.utils import flop_counter

    q, kv = (3, 6, 24, 16), (3, 2, 24, 16)
    assert attention_flops.sdpa_forward_flops(q, kv, kv) == 4 * 3 * 6 * 24 * 24 * 16 == 663_552
    assert attention_flops.sdpa_backward_flops(q, q, kv, kv) == 10 * 3 * 6 * 24 * 24 * 16
    if attention_flops.torch_counts_grouped_heads():
        assert flop_counter.sdpa_flop_count(q, kv, kv) == 663_552
    with pytest.raises(ValueError):
        attention_flops.sdpa_forward_flops(q, (3, 4, 24, 16), (3, 4, 24, 16))  # 4 K/V heads do not divide 6


def test_install_counts_grouped_heads_on_a_torch_whose_helpers_reject_them(monkeypatch):
    """torch 2.11's helpers assert on h_kv < h (seen on an H200: "query/key/value shapes are
    incompatible" for every GQA model's CUDA attention).  Simulated here: after ``install()`` the CUDA
    flash kernel's registered formula counts the hand figure."""
    from torch.utils import flop_counter

    def old(query_shape, key_shape, value_shape, *rest):
        assert query_shape[1] == key_shape[1], "sdpa_flop_count: query/key/value shapes are incompatible"
        return 4 * query_shape[0] * query_shape[1] * query_shape[2] * key_shape[2] * query_shape[3]

    monkeypatch.setattr(flop_counter, "sdpa_flop_count", old)
    monkeypatch.setattr(flop_counter, "sdpa_backward_flop_count", lambda g, q, k, v: old(q, k, v))
    assert not attention_flops.torch_counts_grouped_heads()
    attention_flops.install()
    assert attention_flops.torch_counts_grouped_heads()
    q = torch.empty(3, 6, 24, 16, device="meta")
    kv = torch.empty(3, 2, 24, 16, device="meta")
    formula = flop_registry[torch.ops.aten._scaled_dot_product_flash_attention]
    assert formula(q, kv, kv, out_val=None) == 4 * 3 * 6 * 24 * 24 * 16
