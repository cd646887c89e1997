"""Property tests over random valid configs (hypothesis)."""

from hypothesis import given, settings, strategies as st

from lm_accounting import ModelConfig, account, forward_flops, parameter_breakdown
from lm_accounting.analytic.flops import causal_attention_flops, training_flops


@st.composite
def configs(draw):
    kv = draw(st.integers(1, 8))
    group = draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 64))
    explicit = draw(st.booleans())
    d_model = draw(st.integers(1, 64)) * 2 if explicit else kv * group * head_dim
    return ModelConfig(
        vocab_size=draw(st.integers(1, 300_000)),
        context_length=draw(st.integers(1, 1 << 20)),
        num_layers=draw(st.integers(1, 200)),
        d_model=d_model,
        num_heads=kv * group,
        num_kv_heads=kv,
        head_dim=head_dim if explicit else None,
        d_ff=draw(st.integers(1, 60_000)),
        tie_embeddings=draw(st.booleans()),
        qk_norm=draw(st.booleans()),
    )


def closed_form_forward(c: ModelConfig, B: int, S: int) -> int:
    # Independent closed form: every weight matrix once per token, attention 4·B·h·S²·d_head per layer.
    T = B * S
    weights = c.d_model * c.num_heads * c.d_head * 2 + 2 * c.d_model * c.kv_heads * c.d_head + 3 * c.d_model * c.d_ff
    return c.num_layers * (2 * T * weights + 4 * B * c.num_heads * S * S * c.d_head) + 2 * T * c.d_model * c.vocab_size


@settings(max_examples=200, deadline=None)
@given(configs(), st.integers(1, 64), st.integers(1, 1 << 16))
def test_components_sum_to_independent_totals(c, B, S):
    fwd = forward_flops(c, S, B)
    assert fwd.total == sum(fwd.totals().values()) == closed_form_forward(c, B, S)
    assert fwd.per_layer_total * c.num_layers + fwd["lm_head"].total == fwd.total
    assert abs(sum(fwd.share(k) for k in fwd.totals()) - 1) < 1e-9
    params = parameter_breakdown(c)
    assert params.per_layer_total * c.num_layers + params["token_embeddings"].total + c.d_model + params["lm_head"].total == params.total


@settings(max_examples=200, deadline=None)
@given(configs(), st.integers(1, 8), st.integers(1, 4096))
def test_context_scaling_linear_16x_attention_256x(c, B, S):
    small, big = forward_flops(c, S, B), forward_flops(c, 16 * S, B)
    for item in small:
        factor = 256 if item.group == "attention matmuls" else 16
        assert big[item.key].total == factor * item.total, item.key


@settings(max_examples=200, deadline=None)
@given(configs(), st.integers(1, 8), st.integers(1, 1 << 16))
def test_causal_half_and_training_identities(c, B, S):
    fwd = forward_flops(c, S, B)
    attention = fwd.groups()["attention matmuls"]
    assert 2 * causal_attention_flops(c, S, B) == attention
    t = training_flops(c, S, B)
    assert t.step == 3 * fwd.total == t.palm  # PaLM form with matmul parameters is exact
    assert t.six_nd == 6 * parameter_breakdown(c).total * B * S


def test_huge_values_are_exact():
    # Context 10^7 and a 405B-parameter shape (Llama-3.1-405B: 126 layers, d 16384, 128/8 heads, d_ff 53248).
    c = ModelConfig(vocab_size=128256, context_length=10**7, num_layers=126, d_model=16384,
                    num_heads=128, num_kv_heads=8, d_ff=53248)
    layer = 2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384
    assert parameter_breakdown(c).total == 126 * layer + 2 * 128256 * 16384 + 16384 == 405_853_388_800
    acc = account(c, seq=10**7, batch=3)
    assert acc.forward.total == closed_form_forward(c, 3, 10**7)
    assert acc.forward.total > 2**63  # beyond int64: Python ints stay exact
    assert isinstance(acc.forward.total, int)
