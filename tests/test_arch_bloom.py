"""BLOOM (transformers' models/bloom): the embedding LayerNorm and ALiBi, exact against transformers 5.24.

``BloomModel.word_embeddings_layernorm`` is a LayerNorm (gain and bias, 2·d) on the token embeddings before the
first block (``embedding_norm``); ALiBi (Press et al. 2022; ``build_alibi_tensor``) adds slope_h × key position to
every score and has no parameter (``positions = "alibi"``).  transformers computes QKᵀ as
``alibi.baddbmm(Q, Kᵀ, alpha=1/√d_head)``, which FlopCounterMode counts as the bmm alone (2·m·n·p): the bias add
is a non-matmul FLOP per score in our convention (docs/conventions.md).

The published config.json of bigscience/bloom-560m and bigscience/bloom-7b1 (the latter in the legacy spellings
``n_embed`` and ``num_attention_heads``) are written out below (offline machine).  Method as
tests/test_transformers_truth.py: transformers' model on meta, eager attention, parameters by name,
FlopCounterMode at 1,024 and 2,048 tokens.
"""

import pytest

from lm_accounting.analytic.flops import forward_flops, nonmatmul_flops
from lm_accounting.config import ConfigError, ModelConfig
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

BLOOM_560M = {  # bigscience/bloom-560m/config.json
    "model_type": "bloom",
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["BloomForCausalLM"],
    "attention_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "bias_dropout_fusion": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_dropout": 0.0,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "masked_softmax_fusion": True,
    "n_head": 16,
    "n_inner": None,
    "n_layer": 24,
    "offset_alibi": 100,
    "pad_token_id": 3,
    "pretraining_tp": 1,
    "skip_bias_add": True,
    "skip_bias_add_qkv": False,
    "slow_but_exact": False,
    "torch_dtype": "float16",
    "transformers_version": "4.24.0",
    "unk_token_id": 0,
    "use_cache": True,
    "vocab_size": 250880,
}
BLOOM_7B1 = {  # bigscience/bloom-7b1/config.json (legacy field names)
    **{k: v for k, v in BLOOM_560M.items() if k not in ("hidden_size", "n_head", "n_layer")},
    "n_embed": 4096,
    "num_attention_heads": 32,
    "n_layer": 30,
}
CONFIGS = {"bloom-560m": (BLOOM_560M, 559_214_592), "bloom-7b1": (BLOOM_7B1, 7_069_016_064)}
# published: the model cards' parameter counts ("559,214,592 parameters", "7,069,016,064 parameters")

LAYER_MAP = {
    "input_layernorm": ("ln1",),
    "self_attention.query_key_value": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    "self_attention.dense": ("attn.output_proj",),
    "post_attention_layernorm": ("ln2",),
    "mlp.dense_h_to_4h": ("ffn.fc",),
    "mlp.dense_4h_to_h": ("ffn.proj",),
}
TOP = {
    "transformer.word_embeddings": "token_embeddings",
    "transformer.word_embeddings_layernorm": "embedding_norm",
    "transformer.ln_f": "ln_final",
    "lm_head": "lm_head",
}
PREFIX = "transformer.h."


def our_keys(name: str) -> tuple[str, ...]:
    module, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        module, kind = name, "weight"
    if module in TOP:
        return (TOP[module],)
    keys = LAYER_MAP[module[len(PREFIX) :].partition(".")[2]]
    bias = ".bias" if kind == "bias" and not keys[0].startswith("ln") else ""
    return tuple(f"layers.*.{k}{bias}" for k in keys)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, (values, _) in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    values, published = CONFIGS[name]
    cfg = config_from_hf(values, name=name)
    model = models[name]
    bd = assert_parameters_equal(cfg, model, our_keys, with_empty=False)
    assert bd.total == published
    assert bd["embedding_norm"].total == 2 * cfg.d_model


def test_parameters_by_hand():
    """bloom-560m: embeddings (tied) and their LayerNorm, 24 GPT-2-shaped blocks, the final LayerNorm."""
    V, d, L = 250880, 1024, 24
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert V * d + 2 * d + L * block + 2 * d == 559_214_592


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 2048])
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name][0], name=name).with_context(seq)
    counted = hf_forward_flops(models[name], seq)
    fwd = forward_flops(cfg, seq)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, PREFIX, "self_attention")


def test_alibi_and_embedding_norm_conventions():
    S, h, d = 256, 16, 1024
    nm = nonmatmul_flops(config_from_hf(BLOOM_560M).with_context(S), S)
    assert nm["layers.*.attn.alibi"].per_layer == h * S * S  # one add per score
    assert nm["embedding_norm"].total == 7 * S * d  # a LayerNorm: 7 per element
    assert "layers.*.attn.rope" not in nm.totals()


def test_bloom_fields_are_read_or_refused():
    cfg = config_from_hf(BLOOM_7B1)
    assert (cfg.d_model, cfg.num_heads, cfg.num_layers, cfg.d_ff, cfg.context_length) == (4096, 32, 30, 16384, 2048)
    assert "offset_alibi" in cfg.ignored_fields and "pretraining_tp" in cfg.ignored_fields
    with pytest.raises(ConfigError, match="apply_residual_connection_post_layernorm"):
        config_from_hf({**BLOOM_560M, "apply_residual_connection_post_layernorm": True})
    with pytest.raises(ConfigError, match="positions must be one of rope, learned, alibi"):
        ModelConfig(vocab_size=10, context_length=8, num_layers=1, d_model=8, num_heads=2, d_ff=8, positions="t5")


# -- the live model -------------------------------------------------------------------------------------
TINY_BLOOM = ModelConfig(
    vocab_size=97,
    context_length=64,
    num_layers=2,
    d_model=32,
    num_heads=6,
    head_dim=8,
    d_ff=128,
    norm="layernorm",
    qkv_bias=True,
    output_bias=True,
    mlp_bias=True,
    mlp="gelu",
    positions="alibi",
    embedding_norm=True,
    tie_embeddings=True,
    name="tiny-bloom",
)  # fmt: skip  (6 heads: the slopes' non-power-of-2 branch)


@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(device, seq):
    from lm_accounting.measure.crosscheck import crosscheck

    assert crosscheck(TINY_BLOOM, seq, 2, device=device, backward=True).mismatches() == []


def test_alibi_slopes_and_scores_are_blooms():
    """On CPU: our slopes equal transformers' ``_get_alibi_slopes`` (6 and 16 heads), and our attention with the
    ALiBi bias equals softmax(QKᵀ/√d + m_h·j, causal) V written out."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    from lm_accounting.model.layers import alibi_slopes, scaled_dot_product_attention

    for h in (6, 16):
        torch.testing.assert_close(alibi_slopes(h), _get_alibi_slopes(h, torch.device("cpu")))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 5, 8, generator=gen) for _ in range(3))
    bias = alibi_slopes(6).view(6, 1, 1) * torch.arange(5.0)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = q @ k.transpose(-2, -1) / 8**0.5 + bias
    expected = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, causal, bias=bias), expected)
