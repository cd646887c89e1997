"""Property tests over random valid configs (hypothesis).

The closed forms below use only the raw numbers drawn for a config (vocab, layers, d_model,
query heads, KV heads, head_dim, d_ff, tied, qk-norm), never ModelConfig's derived properties
(``d_head``, ``kv_heads``, ``q_dim``, ``kv_dim``) nor any lm_accounting helper, so a wrong
default (e.g. head_dim = d_model / kv_heads) or a wrong width cannot cancel out.
"""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from lm_accounting import ModelConfig, account, forward_flops, parameter_breakdown
from lm_accounting.analytic.flops import causal_attention_flops, training_flops


@dataclass(frozen=True)
class Shape:
    """The raw numbers a config was built from (head_dim and kv resolved by hand)."""

    V: int
    L: int
    d: int
    h: int
    kv: int
    hd: int
    dff: int
    tied: bool
    qk_norm: bool


@st.composite
def configs(draw):
    kv = draw(st.integers(1, 8))
    group = draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 64))
    explicit = draw(st.booleans())
    d_model = draw(st.integers(1, 64)) * 2 if explicit else kv * group * head_dim
    gqa_given = draw(st.booleans()) or group > 1  # plain MHA may leave num_kv_heads out
    shape = Shape(
        V=draw(st.integers(1, 300_000)),
        L=draw(st.integers(1, 200)),
        d=d_model,
        h=kv * group,
        kv=kv,
        hd=head_dim,  # when not explicit, d_model / h = kv·group·head_dim / (kv·group) = head_dim
        dff=draw(st.integers(1, 60_000)),
        tied=draw(st.booleans()),
        qk_norm=draw(st.booleans()),
    )
    cfg = ModelConfig(
        vocab_size=shape.V,
        context_length=draw(st.integers(1, 1 << 20)),
        num_layers=shape.L,
        d_model=shape.d,
        num_heads=shape.h,
        num_kv_heads=shape.kv if gqa_given else None,
        head_dim=head_dim if explicit else None,
        d_ff=shape.dff,
        tie_embeddings=shape.tied,
        qk_norm=shape.qk_norm,
    )
    return cfg, shape


def closed_form_forward(s: Shape, B: int, S: int) -> int:
    # Every weight matrix once per token (2 FLOPs per weight per token), attention
    # QKᵀ and AV 2·S²·hd each per sequence and query head, LM head 2·T·d·V (tied or not).
    T = B * S
    weights = s.d * s.h * s.hd * 2 + 2 * s.d * s.kv * s.hd + 3 * s.d * s.dff
    return s.L * (2 * T * weights + 4 * B * s.h * S * S * s.hd) + 2 * T * s.d * s.V


def closed_form_params(s: Shape) -> int:
    # Embedding V·d (+ an LM head V·d when untied); per layer Q and O d·h·hd each, K and V
    # d·kv·hd each, three SwiGLU matrices d·d_ff, two RMSNorm gains d, qk-norm gains hd each;
    # the final RMSNorm d.
    layer = 2 * s.d * s.h * s.hd + 2 * s.d * s.kv * s.hd + 3 * s.d * s.dff + 2 * s.d + (2 * s.hd if s.qk_norm else 0)
    return s.V * s.d * (1 if s.tied else 2) + s.L * layer + s.d


def closed_form_matmul_params(s: Shape) -> int:
    # PaLM's N: the weights that take part in a matmul, the LM head's V·d counted even when tied.
    return s.L * (2 * s.d * s.h * s.hd + 2 * s.d * s.kv * s.hd + 3 * s.d * s.dff) + s.V * s.d


@settings(max_examples=200, deadline=None)
@given(configs(), st.integers(1, 64), st.integers(1, 1 << 16))
def test_components_sum_to_independent_totals(drawn, B, S):
    c, s = drawn
    fwd = forward_flops(c, S, B)
    assert fwd.total == sum(fwd.totals().values()) == closed_form_forward(s, B, S)
    assert fwd.per_layer_total * s.L + fwd["lm_head"].total == fwd.total
    assert fwd["lm_head"].total == 2 * B * S * s.d * s.V
    assert abs(sum(fwd.share(k) for k in fwd.totals()) - 1) < 1e-9
    params = parameter_breakdown(c)
    assert params.total == sum(params.totals().values()) == closed_form_params(s)
    assert params["token_embeddings"].total == s.V * s.d
    assert params["lm_head"].total == (0 if s.tied else s.V * s.d)
    assert params.per_layer_total * s.L + s.V * s.d * (1 if s.tied else 2) + s.d == params.total


@settings(max_examples=200, deadline=None)
@given(configs(), st.integers(1, 8), st.integers(1, 4096))
def test_context_scaling_linear_16x_attention_256x(drawn, B, S):
    c, s = drawn
    small, big = forward_flops(c, S, B), forward_flops(c, 16 * S, B)
    for item in small:
        factor = 256 if item.group == "attention matmuls" else 16
        assert big[item.key].total == factor * item.total, item.key
    # the attention matmuls by hand: QKᵀ + AV = 4·B·h·S²·hd per layer
    attention = sum(it.total for it in big if it.group == "attention matmuls")
    assert attention == s.L * 4 * B * s.h * (16 * S) ** 2 * s.hd


@settings(max_examples=200, deadline=None)
@given(configs(), st.integers(1, 8), st.integers(1, 1 << 16))
def test_causal_half_and_training_identities(drawn, B, S):
    c, s = drawn
    # full square QKᵀ + AV = L · 4·B·h·S²·hd; the causal half is L · 2·B·h·S²·hd
    assert causal_attention_flops(c, S, B) == s.L * 2 * B * s.h * S * S * s.hd
    t = training_flops(c, S, B)
    assert t.forward == closed_form_forward(s, B, S)
    assert t.step == 3 * closed_form_forward(s, B, S)  # backward = 2 × forward
    # PaLM (Chowdhery et al. 2022, app. B): (6·N_matmul + 12·L·h·hd·S) FLOPs per token, D = B·S tokens;
    # for this architecture it equals 3 × forward exactly.
    palm = (6 * closed_form_matmul_params(s) + 12 * s.L * s.h * s.hd * S) * B * S
    assert t.palm == palm == t.step
    assert t.six_nd == 6 * closed_form_params(s) * B * S


def test_huge_values_are_exact():
    # Context 10^7 and a 405B-parameter shape (Llama-3.1-405B: 126 layers, d 16384, 128/8 heads, d_ff 53248).
    c = ModelConfig(
        vocab_size=128256,
        context_length=10**7,
        num_layers=126,
        d_model=16384,
        num_heads=128,
        num_kv_heads=8,
        d_ff=53248,
    )
    layer = 2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384
    # the hand formula above: 126 · 3,187,703,808 + 4,202,692,608 + 16,384 = 405,853,388,800
    assert parameter_breakdown(c).total == 126 * layer + 2 * 128256 * 16384 + 16384 == 405_853_388_800
    shape = Shape(V=128256, L=126, d=16384, h=128, kv=8, hd=128, dff=53248, tied=False, qk_norm=False)
    acc = account(c, seq=10**7, batch=3)
    assert acc.forward.total == closed_form_forward(shape, 3, 10**7)
    assert acc.forward.total > 2**63  # beyond int64: Python ints stay exact
    assert isinstance(acc.forward.total, int)
