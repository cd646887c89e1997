"""The cross-check holds for every training setup: fvcore and FlopCounterMode see the fused attention
kernel (registered formulas), and forward + backward equals the setup's hardware FLOPs."""

import dataclasses

import pytest

from lm_accounting.config import load_config
from lm_accounting.measure.crosscheck import crosscheck
from lm_accounting.setup import TrainingSetup, every_setup
from lm_accounting.train_time import train_time

TINY_QWEN = dataclasses.replace(load_config("qwen3-0.6b"), num_layers=2)  # GQA, qk-norm, tied


@pytest.mark.grid
@pytest.mark.parametrize("setup", list(every_setup()), ids=lambda s: s.label)
def test_every_setup_crosschecks_exactly(setup):
    cc = crosscheck(TINY_QWEN, 256, 2, backward=True, setup=setup)
    assert cc.mismatches() == []
    fused = setup.attention == "sdpa"
    assert ("layers.*.attn.sdpa" in cc.forward) == fused  # the live kernel is one module
    for counter in cc.counters:
        assert counter.total == cc.forward.total > 0  # no silent zero for the fused kernel


def test_fused_attention_costs_the_naive_matmuls_and_the_backward_recomputes_scores():
    naive = crosscheck(TINY_QWEN, 128, 1, backward=True)
    fused = crosscheck(TINY_QWEN, 128, 1, backward=True, setup=TrainingSetup(attention="sdpa"))
    assert fused.flop_counter.total == naive.flop_counter.total
    # FlashAttention's backward recomputes QKᵀ: 2·B·h·S²·d_head per layer more than autograd's.
    L, B, h, S, d = 2, 1, 16, 128, 128
    extra = L * 2 * B * h * S * S * d
    assert fused.backward.total - naive.backward.total == extra


def test_hfu_by_hand_for_full_checkpointing():
    cfg = load_config("gpt2-small")
    r = train_time(cfg, 1024, 1, 1, setup=TrainingSetup(checkpoint="full"))
    # Full checkpointing recomputes every block's forward except its last matmul (early stop):
    # per layer: Q, K, V, O 4·2·T·d²; QKᵀ and AV 2·2·h·T²·d_head; W1, W3, W2 3·2·T·d·d_ff (T = S = 1,024).
    T, d, f, h, L, V = 1024, 768, 3072, 12, 12, 50257
    per_layer = 2 * T * d * d * 4 + 2 * 2 * h * T * T * 64 + 2 * T * d * f * 3
    forward = L * per_layer + 2 * T * d * V
    recompute = L * (per_layer - 2 * T * f * d)  # minus ffn.w2
    assert r.matmul_flops.model == 3 * forward
    assert r.matmul_flops.hardware == 3 * forward + recompute
    assert r.hfu == pytest.approx(r.mfu * (3 * forward + recompute) / (3 * forward), rel=1e-12)
