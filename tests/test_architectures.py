"""Architecture options (issue 10, slice 1): the course model is unchanged, every variant is exact.

* The defaults are the course architecture: every preset keeps its answer.
* Each option has its one-line ``ConfigError`` when it is misused, and a TOML key.
* For every variant the live model builds on meta and cpu, and the cross-check (analytic vs fvcore vs
  FlopCounterMode, forward and backward, per component and per layer) is exact.
* Hand computations: the original GPT-2 XL (1,557,611,200 parameters), the windowed attention band and
  the windowed KV cache, written out.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lm_accounting.analytic.flops import attended_pairs, forward_flops, nonmatmul_flops, windowed_attention_flops
from lm_accounting.analytic.kv_cache import cached_tokens, windowed_kv_cache_bytes
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.analytic.params import matmul_params, parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig, apply_overrides, load_config, preset_names
from lm_accounting.measure.crosscheck import crosscheck
from lm_accounting.model import build_model
from lm_accounting.model.layers import GeGLU, GeluMLP, LayerNorm, Linear

TINY = dict(vocab_size=97, context_length=64, num_layers=3, d_model=32, num_heads=4, d_ff=48, name="tiny")
VARIANTS = {
    "openai-gpt2": dict(
        norm="layernorm",
        qkv_bias=True,
        output_bias=True,
        mlp_bias=True,
        mlp="gelu",
        positions="learned",
        max_position_embeddings=80,
        tie_embeddings=True,
    ),
    "qwen2": dict(qkv_bias=True, num_kv_heads=2),
    "llama-biases": dict(qkv_bias=True, output_bias=True, mlp_bias=True, num_kv_heads=2),
    "gemma2": dict(
        norm_placement="sandwich",
        mlp="geglu",
        sliding_window=16,
        full_attention_every=2,
        scale_embeddings=True,
        num_kv_heads=2,
        head_dim=16,
        tie_embeddings=True,
    ),
    "gemma3": dict(
        norm_placement="sandwich",
        mlp="geglu",
        sliding_window=8,
        full_attention_every=2,
        scale_embeddings=True,
        qk_norm=True,
        num_kv_heads=1,
        head_dim=16,
        tie_embeddings=True,
    ),
    "olmo2": dict(norm_placement="post", qk_norm=True, qk_norm_scope="projection", num_kv_heads=2),
    "mistral": dict(sliding_window=8, num_kv_heads=2),
    "gelu-mlp": dict(mlp="gelu"),
    "layernorm-post-geglu": dict(norm="layernorm", norm_placement="post", mlp="geglu", mlp_bias=True),
}


def tiny(variant: str, **extra) -> ModelConfig:
    return ModelConfig(**{**TINY, **VARIANTS[variant], **extra})


# -- the course model is unchanged ----------------------------------------------------------------
def test_defaults_are_the_course_architecture():
    for name in ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-3-8b", "qwen3-0.6b"):
        cfg = load_config(name)
        assert cfg.course_architecture and cfg.unsupported_for_replay() == []
    xl = load_config("gpt2-xl")
    assert parameter_breakdown(xl).total == 2_127_057_600
    assert forward_flops(xl, 1024).total == 4_513_336_524_800
    assert xl.architecture == "pre-RMSNorm · SwiGLU · RoPE" and xl.family == "course (Llama-style)"


def test_every_shipped_preset_loads_and_new_options_are_named_for_the_replay():
    for name in preset_names():
        cfg = load_config(name)
        assert cfg.course_architecture == (cfg.unsupported_for_replay() == [])
    assert tiny("openai-gpt2").unsupported_for_replay() == [
        "LayerNorm",
        "output or MLP biases",
        "gelu MLP",
        "learned positions",
    ]
    assert tiny("gemma2").unsupported_for_replay() == [
        "sandwich norms",
        "geglu MLP",
        "sliding-window attention",
        "scaled embeddings",
    ]
    assert tiny("olmo2").unsupported_for_replay() == ["post norms", "whole-projection qk-norm"]


# -- validation: one line each --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(norm="batchnorm"), "norm must be one of rmsnorm, layernorm"),
        (dict(norm_placement="middle"), "norm_placement must be one of pre, sandwich, post"),
        (dict(mlp="relu3"), "mlp must be one of swiglu, geglu, gelu"),
        (dict(positions="t5"), "positions must be one of rope, learned, alibi"),
        (dict(qk_norm_scope="token", qk_norm=True), "qk_norm_scope must be one of head, projection"),
        (dict(qkv_bias=1), "qkv_bias must be true or false"),
        (dict(mlp_bias="yes"), "mlp_bias must be true or false"),
        (dict(sliding_window=0), "sliding_window must be positive"),
        (dict(sliding_window=4.5), "sliding_window must be an integer"),
        (dict(full_attention_every=2), "full_attention_every applies only with a sliding_window"),
        (dict(sliding_window=8, full_attention_every=1), "full_attention_every must be at least 2"),
        (dict(qk_norm_scope="projection"), "qk_norm_scope = projection applies only with qk_norm = true"),
        (dict(max_position_embeddings=128), "applies only with positions = learned"),
        (dict(positions="learned", max_position_embeddings=32), "context 64 exceeds the 32 learned positions"),
        (dict(positions="learned", max_position_embeddings=-1), "max_position_embeddings must be positive"),
        (dict(ignored_fields=["x"]), "ignored_fields must be a tuple"),
    ],
)
def test_misused_options_are_one_line_config_errors(change, message):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**{**TINY, **change})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_odd_head_dim_is_fine_without_rope_and_learned_positions_bound_the_context():
    cfg = ModelConfig(**{**TINY, "d_model": 36, "num_heads": 4}, positions="learned")  # head_dim 9
    assert cfg.d_head == 9 and cfg.position_rows == 64
    with pytest.raises(ConfigError, match="head_dim=9 is odd"):
        dataclasses.replace(cfg, positions="rope")
    gpt2 = load_config("openai-gpt2-xl")
    with pytest.raises(ConfigError, match="context 2,048 exceeds the 1,024 learned positions"):
        gpt2.with_context(2048)


def test_toml_keys_and_overrides_for_every_option(tmp_path):
    text = """
vocab_size = 97
context_length = 64
num_layers = 2
d_model = 32
num_heads = 4
d_ff = 48
norm = "layernorm"
norm_placement = "sandwich"
qkv_bias = true
output_bias = true
mlp_bias = true
mlp = "geglu"
positions = "learned"
max_position_embeddings = 128
qk_norm = true
qk_norm_scope = "projection"
sliding_window = 16
full_attention_every = 2
scale_embeddings = true
"""
    path = tmp_path / "all.toml"
    path.write_text(text)
    cfg = load_config(path)
    assert (cfg.norm, cfg.norm_placement, cfg.mlp, cfg.positions, cfg.qk_norm_scope) == (
        "layernorm",
        "sandwich",
        "geglu",
        "learned",
        "projection",
    )
    assert cfg.qkv_bias and cfg.output_bias and cfg.mlp_bias and cfg.scale_embeddings
    assert (cfg.position_rows, cfg.sliding_window, cfg.full_attention_every) == (128, 16, 2)
    assert apply_overrides(cfg, {"mlp": "gelu"}).mlp == "gelu"
    with pytest.raises(ConfigError, match="mlp must be one of"):
        apply_overrides(cfg, {"mlp": "moe"})
    path.write_text(text + "\nignored_fields = []")
    with pytest.raises(ConfigError, match="unknown key 'ignored_fields'"):
        load_config(path)


# -- hand computations ----------------------------------------------------------------------------
def test_original_gpt2_xl_parameters_by_hand():
    """GPT-2 XL (openai-community/gpt2-xl config.json: n_embd 1600, n_layer 48, n_head 25, n_positions 1024,
    vocab 50257, n_inner null -> 4·1600, tied).  Per layer: ln_1, ln_2 (2·2d), c_attn (d·3d + 3d), attn.c_proj
    (d² + d), mlp.c_fc (d·4d + 4d), mlp.c_proj (4d·d + d); plus wte, wpe and ln_f."""
    d, L, V, P = 1600, 48, 50257, 1024
    per_layer = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert per_layer == 6_400 + 7_684_800 + 2_561_600 + 10_246_400 + 10_241_600 == 30_740_800
    total = V * d + P * d + L * per_layer + 2 * d
    assert total == 80_411_200 + 1_638_400 + 1_475_558_400 + 3_200 == 1_557_611_200
    cfg = load_config("openai-gpt2-xl")
    bd = parameter_breakdown(cfg)
    assert bd.total == total
    assert bd["layers.*.attn.q_proj.bias"].total == L * d and bd["position_embeddings"].total == P * d
    assert bd["layers.*.ln1"].per_layer == 2 * d and bd["lm_head"].total == 0
    # forward matmuls at 1,024 tokens: per layer 2·T·(3d² + d² + 8d²) + 4·T²·d, plus the tied LM head 2·T·d·V
    T = 1024
    assert forward_flops(cfg, T).total == L * (2 * T * 12 * d * d + 4 * T * T * d) + 2 * T * d * V
    # the PaLM N counts 2 FFN matrices here, and no bias
    assert matmul_params(cfg) == L * 12 * d * d + V * d


def test_bias_and_layernorm_elementwise_conventions_by_hand():
    cfg = tiny("openai-gpt2")
    T, d, dff, L = 64, 32, 48, 3
    nm = nonmatmul_flops(cfg, T)
    assert nm["layers.*.ln1"].per_layer == 7 * T * d  # LayerNorm: 7 per element
    assert nm["layers.*.attn.q_proj.bias"].per_layer == T * d  # a bias add: 1 per output element
    assert nm["layers.*.ffn.fc.bias"].per_layer == T * dff and nm["layers.*.ffn.proj.bias"].per_layer == T * d
    assert nm["layers.*.ffn.gelu"].per_layer == 9 * T * dff and nm["position_embeddings"].total == T * d
    assert "layers.*.attn.rope" not in nm.totals() and "layers.*.ffn.silu" not in nm.totals()
    assert nm["ln_final"].total == 7 * T * d and nm["layers.*.ln2"].total == L * 7 * T * d


def test_sliding_window_band_and_kv_cache_by_hand():
    # S = 10, w = 4: query i sees min(i+1, 4) keys: 1+2+3+4 + 6·4 = 34 = 4·5/2 + (10-4)·4
    assert attended_pairs(10, 4) == 1 + 2 + 3 + 4 + 6 * 4 == 34
    assert attended_pairs(3, 4) == 6 and attended_pairs(10, None) == 55
    cfg = tiny("gemma2", num_layers=4)  # layers 0, 2 windowed (w = 16); 1, 3 full; h = 4, d_head = 16
    assert [cfg.layer_windowed(i) for i in range(4)] == [True, False, True, False] and cfg.windowed_layers == 2
    S, h, hd = 64, 4, 16
    full = 4 * h * S * S * hd  # QKᵀ + AV, full square, one layer
    band = 4 * h * hd * (16 * 17 // 2 + (S - 16) * 16)
    assert windowed_attention_flops(cfg, S) == 2 * full + 2 * band
    fwd = forward_flops(cfg, S)
    assert fwd.groups()["attention matmuls"] == 4 * full  # the totals keep the full square
    # KV cache: 2 · kv · d_head · B · bytes · (2 full layers · S + 2 windowed · w), kv = 2, B = 3, bf16
    assert cached_tokens(cfg, S) == 2 * 64 + 2 * 16
    assert windowed_kv_cache_bytes(cfg, S, 3, "bf16") == 2 * 2 * 16 * 3 * 2 * (2 * 64 + 2 * 16)
    assert windowed_kv_cache_bytes(cfg, 8, 1, "fp32") == kv_cache_bytes(cfg, 8, 1, "fp32")  # S <= w: no saving
    course = load_config("llama-3-8b")
    assert windowed_kv_cache_bytes(course, 8192, 2, "bf16") == kv_cache_bytes(course, 8192, 2, "bf16")
    mistral = tiny("mistral")  # every layer windowed
    assert cached_tokens(mistral, 64) == 3 * 8 and windowed_attention_flops(mistral, 64) == 3 * 4 * 4 * 8 * (
        8 * 9 // 2 + 56 * 8
    )


def test_whole_projection_qk_norm_and_sandwich_norm_parameters_by_hand():
    olmo = tiny("olmo2")  # h = 4, kv = 2, d_head = 8, d = 32
    bd = parameter_breakdown(olmo)
    assert bd["layers.*.attn.q_norm"].per_layer == 4 * 8 and bd["layers.*.attn.k_norm"].per_layer == 2 * 8
    assert "layers.*.ln1" not in bd.totals() and bd["layers.*.post_attn_norm"].per_layer == 32
    gemma = tiny("gemma3")
    bd = parameter_breakdown(gemma)
    assert bd["layers.*.attn.q_norm"].per_layer == 16 == bd["layers.*.attn.k_norm"].per_layer
    norms = [k for k in bd.totals() if k.startswith("layers.*.") and "norm" in k or k.endswith(("ln1", "ln2"))]
    assert norms == [
        "layers.*.ln1",
        "layers.*.attn.q_norm",
        "layers.*.attn.k_norm",
        "layers.*.post_attn_norm",
        "layers.*.ln2",
        "layers.*.post_ffn_norm",
    ]


# -- the live model ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_crosscheck_is_exact_for_every_variant_on_meta(variant):
    cc = crosscheck(tiny(variant), 64, 2, backward=True)
    assert cc.mismatches() == []
    assert cc.params.total == sum(cc.live_params.values())


def test_crosscheck_is_exact_on_cpu(monkeypatch):
    # check_live_run sizes a cpu run with the memory replay, which covers the course architecture only:
    # the tiny variants need a few MB, so skip that estimate here.
    from lm_accounting.measure import devices

    monkeypatch.setattr(devices, "counting_run_bytes", lambda *args: 0)
    for variant in ("openai-gpt2", "gemma3", "olmo2"):
        assert crosscheck(tiny(variant), 32, 1, device="cpu", backward=True).mismatches() == [], variant


def test_layers_match_torch_and_the_formulas():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 12)
    ln = LayerNorm(12, eps=1e-5)
    ln.weight.data.normal_()
    ln.bias.data.normal_()
    torch.testing.assert_close(ln(x), F.layer_norm(x, (12,), ln.weight, ln.bias, 1e-5))
    lin = Linear(12, 7, bias=True)
    lin.bias.bias.data.normal_()
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias.bias"]
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias.bias))
    gg = GeGLU(12, 20)
    ref = gg.w2(F.gelu(x @ gg.w1.weight.t(), approximate="tanh") * (x @ gg.w3.weight.t()))
    torch.testing.assert_close(gg(x), ref)
    mlp = GeluMLP(12, 20, bias=True)
    assert [n for n, _ in mlp.named_parameters()] == ["fc.weight", "fc.bias.bias", "proj.weight", "proj.bias.bias"]


def test_sliding_window_hides_tokens_beyond_the_window():
    """One windowed layer, w = 4: the logits at position i >= 4 cannot depend on token 0; without the
    window they do."""
    cfg = tiny("mistral", num_layers=1, sliding_window=4)
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    tokens = torch.randint(0, 97, (1, 12))
    changed = tokens.clone()
    changed[0, 0] = (tokens[0, 0] + 1) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[0, 4:], b[0, 4:]) and not torch.equal(a[0, :4], b[0, :4])
    full = build_model(dataclasses.replace(cfg, sliding_window=None), device="cpu")
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.equal(full(tokens)[0, 4:], full(changed)[0, 4:])


def test_every_variant_trains_a_step_on_cpu_with_finite_values():
    for variant in VARIANTS:
        torch.manual_seed(0)
        model = build_model(tiny(variant), device="cpu")
        tokens = torch.randint(0, 97, (2, 16))
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters()), variant


def test_learned_positions_replace_the_rope_table():
    model = build_model(tiny("openai-gpt2"))
    assert model.rope is None and [n for n, _ in model.named_buffers()] == []
    assert model.position_embeddings.weight.shape == (80, 32)
    assert model.lm_head.weight is model.token_embeddings.weight


def test_sliding_window_refuses_the_fused_kernel():
    from lm_accounting.config import AccountingError
    from lm_accounting.setup import TrainingSetup

    with pytest.raises(AccountingError, match="sliding-window attention runs with attention=naive only"):
        build_model(tiny("mistral"), setup=TrainingSetup(attention="sdpa"))
