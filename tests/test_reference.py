"""Reference figures from the CS336 handout, a published solution, and public configs, asserted exactly.

Every expected number here is either quoted from a source (named in the comment) or
computed by a hand formula written out in the test, independently of lm_accounting's
per-component functions.
"""

from lm_accounting import account, load_config, parameter_breakdown
from lm_accounting.analytic.flops import forward_flops


def test_gpt2_xl_parameters_match_handout():
    # CS336 A1 transformer_accounting (a), published solution: ~2.13B parameters, 8.51 GB in fp32.
    n = parameter_breakdown(load_config("gpt2-xl")).total
    assert n == 2_127_057_600
    assert round(4 * n / 1e9, 2) == 8.51


def test_gpt2_xl_forward_flops_match_seed_at_1024():
    # published solution (b): per layer 90.5969664e9, 48 layers 4.3486543872e12, LM head 1.646821376e11.
    fwd = forward_flops(load_config("gpt2-xl"), seq=1024)
    assert fwd.per_layer_total == 90_596_966_400
    assert fwd.per_layer_total * 48 == 4_348_654_387_200
    assert fwd["lm_head"].total == 164_682_137_600
    assert fwd.total == 4_513_336_524_800
    # published solution (c): FFN ~62.9B per layer, projections ~21.0B, attention matmuls ~6.7B.
    per_layer = {g: v // 48 for g, v in fwd.groups().items() if g != "lm head"}
    assert round(per_layer["ffn"] / 1e9, 1) == 62.9
    assert round(per_layer["attention projections"] / 1e9, 1) == 21.0
    assert round(per_layer["attention matmuls"] / 1e9, 1) == 6.7


def test_gpt2_xl_at_16k_context():
    # published solution (e): ~1.495e14 FLOPs (33.1x), attention matmuls ~55%.
    # Hand count at S = 16,384 (d = 1,600, d_ff = 6,400, V = 50,257, L = 48), per layer:
    #   projections 8·S·d² = 335,544,320,000;  QKᵀ + AV 4·S²·d = 1,717,986,918,400;
    #   SwiGLU 6·S·d·d_ff = 1,006,632,960,000;  sum 3,060,164,198,400;  × 48 = 146,887,881,523,200
    #   LM head 2·S·d·V = 2,634,914,201,600;  total 149,522,795,724,800
    #   attention share 48 · 1,717,986,918,400 / 149,522,795,724,800 = 0.5515
    acc = account(load_config("gpt2-xl"), seq=16384)
    assert acc.forward.total == 149_522_795_724_800
    assert acc.attention_matmuls == 48 * 1_717_986_918_400
    assert round(acc.forward.total / 4_513_336_524_800, 1) == 33.1
    share = acc.attention_matmuls / acc.forward.total
    assert 0.545 < share < 0.555


def test_gpt2_xl_hand_formula():
    # Written out: S=1024, d=1600, d_ff=6400, V=50257, L=48.
    S, d, dff, V, L = 1024, 1600, 6400, 50257, 48
    per_layer = 4 * 2 * S * d * d + 4 * S * S * d + 6 * S * d * dff
    assert forward_flops(load_config("gpt2-xl"), seq=S).total == L * per_layer + 2 * S * d * V


def test_gpt2_family_parameters_closed_form():
    # Untied, d_ff = 4d, MHA: N = 2·V·d + L·(4d² + 3·d·4d + 2d) + d = 2Vd + L(16d² + 2d) + d.
    for name, L, d in (
        ("gpt2-small", 12, 768),
        ("gpt2-medium", 24, 1024),
        ("gpt2-large", 36, 1280),
        ("gpt2-xl", 48, 1600),
    ):
        V = 50257
        assert parameter_breakdown(load_config(name)).total == 2 * V * d + L * (16 * d * d + 2 * d) + d, name


def test_llama3_8b_public_parameter_count():
    # Public figure for Meta-Llama-3-8B (its model card: 8.03B; the safetensors total 8,030,261,248).
    assert parameter_breakdown(load_config("llama-3-8b")).total == 8_030_261_248


def test_llama3_8b_ffn_dim_from_params_json():
    # Llama's FeedForward: hidden = int(2·4d/3); int(multiplier·hidden); round up to multiple_of.
    d, multiple_of, multiplier = 4096, 1024, 1.3
    hidden = int(multiplier * int(2 * 4 * d / 3))
    hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    assert load_config("llama-3-8b").d_ff == hidden == 14336


def test_qwen3_0_6b_hand_count():
    # Qwen3-0.6B: tied, GQA 16/8 heads of 128, qk-norm, no biases.
    V, d, L, h, kv, hd, dff = 151936, 1024, 28, 16, 8, 128, 3072
    layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * dff + 2 * d + 2 * hd
    assert parameter_breakdown(load_config("qwen3-0.6b")).total == V * d + L * layer + d == 596_049_920
    # Its public "non-embedding" figure is 0.44B.
    assert round((596_049_920 - V * d) / 1e9, 2) == 0.44


def test_tied_lm_head_costs_flops_but_no_parameters():
    cfg = load_config("qwen3-0.6b")
    assert parameter_breakdown(cfg)["lm_head"].total == 0
    assert forward_flops(cfg, seq=10)["lm_head"].total == 2 * 10 * 1024 * 151936
