"""Model states, AdamW temporaries, course-convention activations and Korthikanti's formula.

Every expected number is worked out by hand in the test (written-out arithmetic), never
by calling the function under test.
"""

import pytest

from lm_accounting.analytic.course import (
    course_activation_breakdown,
    course_linear_in_batch,
    course_peak,
    korthikanti_activation_bytes,
    max_batch,
)
from lm_accounting.analytic.memory import adamw_step_temporary_bytes, model_state_breakdown, parameter_tensor_sizes
from lm_accounting.config import AccountingError, ModelConfig, load_config

GB80 = 80 * 10**9
GIB80 = 80 * 2**30

XL_PARAMS = 2_127_057_600
# GPT-2 XL, S = 1024: per layer 16·S·d + 2·h·S², then ln_final S·d and logits S·V.
XL_LAYER = 16 * 1024 * 1600 + 2 * 25 * 1024**2  # 26,214,400 + 52,428,800 = 78,643,200
XL_A = 4 * (48 * XL_LAYER + 1024 * 1600 + 2 * 1024 * 50257)  # 15,517,753,344
XL_A_ONCE = 4 * (48 * XL_LAYER + 1024 * 1600 + 1024 * 50257 + 1024)  # CE = one value per position
XL_B = 16 * XL_PARAMS  # 34,032,921,600
XL_B_FFN2 = 16 * (XL_PARAMS - 48 * 1600 * 6400)  # 16 · 1,635,537,600 = 26,168,601,600


def tiny(**kw):
    base = dict(vocab_size=10, context_length=8, num_layers=1, d_model=4, num_heads=2, d_ff=8)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture(scope="module")
def xl():
    return load_config("gpt2-xl")


# -- course convention, GPT-2 XL ----------------------------------------------
def test_gpt2_xl_course_a_and_b(xl):
    assert XL_A == 15_517_753_344 and XL_B == 34_032_921_600  # the hand arithmetic itself
    assert course_linear_in_batch(xl, 1024) == (XL_A, XL_B)


def test_gpt2_xl_course_max_batch():
    a, b = XL_A, XL_B  # the hand values, not the function's output
    # (80e9 - 34,032,921,600) / 15,517,753,344 = 45,967,078,400 / 15,517,753,344 = 2.96
    assert max_batch(a, b, GB80) == 2
    # (85,899,345,920 - 34,032,921,600) / 15,517,753,344 = 51,866,424,320 / 15,517,753,344 = 3.34
    assert max_batch(a, b, GIB80) == 3


def test_gpt2_xl_alternative_conventions(xl):
    assert course_linear_in_batch(xl, 1024, logits_twice=False) == (XL_A_ONCE, XL_B)
    assert course_linear_in_batch(xl, 1024, ffn_matrices=2) == (XL_A, XL_B_FFN2)
    assert course_linear_in_batch(xl, 1024, logits_twice=False, ffn_matrices=2) == (XL_A_ONCE, XL_B_FFN2)
    # logits once: a = 15,311,904,768; 45,967,078,400 / a = 3.002 -> 3; 51,866,424,320 / a = 3.39 -> 3
    assert XL_A_ONCE == 15_311_904_768
    assert max_batch(XL_A_ONCE, XL_B, GB80) == 3
    assert max_batch(XL_A_ONCE, XL_B, GIB80) == 3
    # 2 FFN matrices: (80e9 - 26,168,601,600) / 15,517,753,344 = 3.47 -> 3; GiB: 3.85 -> 3
    assert max_batch(XL_A, XL_B_FFN2, GB80) == 3
    assert max_batch(XL_A, XL_B_FFN2, GIB80) == 3


def test_gpt2_xl_course_peak_components(xl):
    peak = course_peak(xl, 1024, 4)
    assert peak.parameters == 4 * XL_PARAMS
    assert peak.gradients == 4 * XL_PARAMS
    assert peak.optimizer == 8 * XL_PARAMS
    assert peak.activations == 4 * XL_A
    assert peak.total == 4 * XL_A + XL_B
    assert peak.to_dict()["total"] == 4 * XL_A + XL_B


def test_gpt2_xl_course_activation_items(xl):
    acts = course_activation_breakdown(xl, 1024, batch=2)
    S, d, h, V, B = 1024, 1600, 25, 50257, 2
    assert acts["layers.*.norms"].per_layer == 4 * B * 2 * S * d
    assert acts["layers.*.attn.qkv"].per_layer == 4 * B * 3 * S * d
    assert acts["layers.*.attn.scores"].per_layer == 4 * B * h * S * S
    assert acts["layers.*.attn.softmax"].per_layer == 4 * B * h * S * S
    assert acts["layers.*.attn.weighted_sum"].per_layer == 4 * B * S * d
    assert acts["layers.*.attn.output_proj"].per_layer == 4 * B * S * d
    assert acts["layers.*.ffn.w1"].per_layer == 4 * B * S * 6400
    assert acts["layers.*.ffn.silu"].per_layer == 4 * B * S * 6400
    assert acts["layers.*.ffn.w2"].per_layer == 4 * B * S * d
    assert acts["layers.*.ffn.w2"].total == 48 * 4 * B * S * d
    assert acts["ln_final"].total == 4 * B * S * d and acts["ln_final"].per_layer is None
    assert acts["lm_head"].total == 4 * B * S * V
    assert acts["cross_entropy"].total == 4 * B * S * V
    assert acts.per_layer_total == 4 * B * XL_LAYER
    assert acts.unit == "bytes"
    once = course_activation_breakdown(xl, 1024, batch=2, logits_twice=False)
    assert once["cross_entropy"].total == 4 * B * S


def test_course_gqa_and_explicit_head_dim():
    # d = 64, 8 query heads, 2 KV heads of head_dim 12: q_dim = 96, kv_dim = 24
    # (q_dim + 2·kv_dim = 144, not 3·d = 192; weighted sum 96 wide, not d = 64)
    cfg = ModelConfig(
        vocab_size=100, context_length=32, num_layers=3, d_model=64, num_heads=8, d_ff=256, num_kv_heads=2, head_dim=12
    )
    acts = course_activation_breakdown(cfg, 10, batch=3)
    assert acts["layers.*.attn.qkv"].per_layer == 4 * 3 * 10 * (96 + 2 * 24)  # 17,280
    assert acts["layers.*.attn.qkv"].total == 3 * 17_280
    assert acts["layers.*.attn.weighted_sum"].per_layer == 4 * 3 * 10 * 96
    assert acts["layers.*.attn.scores"].per_layer == 4 * 3 * 8 * 10 * 10


# -- model states -------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"qk_norm": True, "tie_embeddings": True}, {"num_kv_heads": 1, "num_layers": 3}])
def test_parameter_tensor_sizes_match_live_model(kw):
    # Against the live model's own parameters() order, built on meta.
    from lm_accounting.model import build_model

    cfg = tiny(**kw)
    assert parameter_tensor_sizes(cfg) == [p.numel() for p in build_model(cfg, device="meta").parameters()]


def test_parameter_tensor_sizes_order():
    # V = 10, d = 4, h = 2 (d_head 2), d_ff = 8, one layer, untied
    assert parameter_tensor_sizes(tiny()) == [40, 4, 16, 16, 16, 16, 4, 32, 32, 32, 4, 40]
    # qk-norm adds two d_head = 2 gains after output_proj; tied drops the last lm_head
    assert parameter_tensor_sizes(tiny(qk_norm=True, tie_embeddings=True)) == [
        40,
        4,
        16,
        16,
        16,
        16,
        2,
        2,
        4,
        32,
        32,
        32,
        4,
    ]


def test_model_state_breakdown():
    # 40 + (4 + 4·16 + 4 + 3·32) + 4 + 40 = 252 parameters
    states = model_state_breakdown(tiny())
    assert states.totals() == {"parameters": 1008, "gradients": 1008, "adamw.exp_avg": 1008, "adamw.exp_avg_sq": 1008}
    assert states.total == 16 * 252 and states.unit == "bytes"
    # tied: the 40-element table counted once -> 212 params, bf16 = 2 bytes
    tied = model_state_breakdown(tiny(tie_embeddings=True), "bf16")
    assert tied["gradients"].total == 2 * 212
    assert tied.total == 8 * 212


def test_adamw_temporaries_tiny():
    cfg = tiny()  # sizes [40, 4, 16, 16, 16, 16, 4, 32, 32, 32, 4, 40], N = 252
    assert adamw_step_temporary_bytes(cfg, "fp32", "foreach") == 4 * 252
    assert adamw_step_temporary_bytes(cfg, "bf16", "foreach") == 2 * 252
    # for-loop: prev + 2·cur = 80, 48, 36, 48, 48, 48, 36, 68, 96, 96, 40, 84 -> 96 (w2 after w1)
    assert adamw_step_temporary_bytes(cfg, "fp32", "for-loop") == 4 * 96
    assert adamw_step_temporary_bytes(cfg, "fp32", "fused") == 0


@pytest.mark.parametrize("impl", ["foreach", "for-loop"])
@pytest.mark.parametrize("kw", [{}, {"vocab_size": 100}, {"vocab_size": 100, "tie_embeddings": True}])
def test_adamw_temporaries_equal_the_tracker(impl, kw):
    # Measured on the live model (meta): what AdamW.step() holds above the state it starts
    # from (params, m, v, grads = the end of backward).
    from lm_accounting.measure.memory import measure_step

    cfg = tiny(**kw)
    measured = measure_step(cfg, 5, 2, "fp32", "meta", impl)
    assert measured.optimizer_step.peak - measured.backward.end == adamw_step_temporary_bytes(cfg, "fp32", impl)


def test_adamw_for_loop_counts_previous_denom():
    # V = 100: embedding and lm_head 400 each; lm_head follows ln_final (4): 4 + 2·400 = 804
    assert adamw_step_temporary_bytes(tiny(vocab_size=100), "fp32", "for-loop") == 4 * 804
    # tied: no lm_head; the largest is the embedding itself at i = 0: 0 + 2·400 = 800
    assert adamw_step_temporary_bytes(tiny(vocab_size=100, tie_embeddings=True), "fp32", "for-loop") == 4 * 800


def test_gpt2_xl_adamw_temporaries(xl):
    assert adamw_step_temporary_bytes(xl, "fp32", "foreach") == 4 * XL_PARAMS  # 20 vs 16 B/param
    # ln_final (1600) then lm_head (50257·1600 = 80,411,200): 1600 + 160,822,400
    assert adamw_step_temporary_bytes(xl, "fp32", "for-loop") == 4 * (1600 + 2 * 80_411_200)


# -- Korthikanti et al. 2022 ----------------------------------------------------
def test_korthikanti_hand_example():
    cfg = ModelConfig(vocab_size=100, context_length=32, num_layers=2, d_model=64, num_heads=4, d_ff=256)
    # per layer s·b·h·(34 + 5as/h) = 10·3·64·(34 + 200/64) = 1920 · 37.125 = 71,280; two layers
    assert korthikanti_activation_bytes(cfg, 10, 3) == 142_560


def test_korthikanti_gpt2_xl(xl):
    # 48 · 1024 · 1600 · (34 + 5·25·1024/1600) = 48 · 1024 · 1600 · 114
    assert korthikanti_activation_bytes(xl, 1024) == 8_965_324_800


# -- max_batch and bad inputs --------------------------------------------------
def test_max_batch_edges():
    assert max_batch(10, 5, 35) == 3  # exact fit: 10·3 + 5 = 35
    assert max_batch(10, 5, 34) == 2
    assert max_batch(10, 5, 14) == 0  # states fit, batch 1 does not
    assert max_batch(10, 50, 20) == 0  # not even the states fit
    assert max_batch(10, 0, 10) == 1


@pytest.mark.parametrize("args", [(0, 5, 100), (-1, 5, 100), (10, -1, 100), (10, 5, -1), (1.5, 5, 100), (True, 5, 100)])
def test_max_batch_rejects(args):
    with pytest.raises(AccountingError):
        max_batch(*args)


def test_bad_inputs_raise(xl):
    with pytest.raises(AccountingError, match="fp32, bf16, fp16"):
        model_state_breakdown(xl, "int8")
    with pytest.raises(AccountingError, match="foreach, for-loop, fused"):
        adamw_step_temporary_bytes(xl, "fp32", "apex")
    with pytest.raises(AccountingError, match="2 or 3"):
        course_peak(xl, 1024, ffn_matrices=1)
    with pytest.raises(AccountingError):
        course_activation_breakdown(xl, 1024, logits_twice="yes")
    with pytest.raises(AccountingError):
        course_activation_breakdown(xl, 1024, batch=0)
    with pytest.raises(AccountingError):
        korthikanti_activation_bytes(xl, 0)
    with pytest.raises(TypeError):
        course_linear_in_batch(xl, 1024, logits=False)
