"""OLMo (transformers' models/olmo): norms without weights, exact against transformers 5.24.

``OlmoLayerNorm`` is ``F.layer_norm(x, shape, None, None, eps=1e-5)``: no gain and no bias, so the block norms
and the final norm add no parameter (``norm_weights = false``), and 5 non-matmul FLOPs per element instead of
LayerNorm's 7 (docs/conventions.md: the gain's multiply and the bias add are not done).

The published config.json values of allenai/OLMo-7B-hf and allenai/OLMo-1B-hf (tied) are written out below
(offline machine).  Method as tests/test_transformers_truth.py: transformers' model on meta, eager attention,
parameters by name, FlopCounterMode at 1,024 and 2,048 tokens (OLMo's 2,048 positions).
"""

import pytest

from lm_accounting.analytic.flops import forward_flops, nonmatmul_flops
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ModelConfig
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

OLMO = {  # allenai/OLMo-7B-hf/config.json
    "model_type": "olmo",
    "architectures": ["OlmoForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "clip_qkv": None,
    "eos_token_id": 50279,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pad_token_id": 1,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 50304,
}
CONFIGS = {
    "olmo-7b": OLMO,
    "olmo-1b": {  # allenai/OLMo-1B-hf/config.json (tied embeddings)
        **OLMO,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 16,
        "num_hidden_layers": 16,
        "num_key_value_heads": 16,
        "tie_word_embeddings": True,
    },
}
LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "mlp.gate_proj": ("ffn.w1",),
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
}
TOP = {"model.embed_tokens": "token_embeddings", "lm_head": "lm_head"}
PREFIX = "model.layers."


def our_keys(name: str) -> tuple[str, ...]:
    if name.removesuffix(".weight") in TOP:
        return (TOP[name.removesuffix(".weight")],)
    module = name[len(PREFIX) :].partition(".")[2].removesuffix(".weight")
    return tuple(f"layers.*.{k}" for k in LAYER_MAP[module])


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    bd = assert_parameters_equal(cfg, model, our_keys, with_empty=False)
    for key in ("layers.*.ln1", "layers.*.ln2", "ln_final"):  # listed, with no parameter
        assert bd[key].total == 0


def test_parameters_by_hand():
    """OLMo-7B: 32 layers of 4·d² attention and 3·d·d_ff SwiGLU, no norm parameter; untied V·d twice."""
    V, d, f, L = 50304, 4096, 11008, 32
    total = L * (4 * d * d + 3 * d * f) + 2 * V * d
    assert parameter_breakdown(config_from_hf(OLMO)).total == total == 6_888_095_744


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 2048])
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    counted = hf_forward_flops(models[name], seq)
    fwd = forward_flops(cfg, seq)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, PREFIX, "self_attn")


def test_weightless_norm_convention():
    """5 non-matmul FLOPs per element for a LayerNorm without gain and bias (7 with them)."""
    S = 256
    cfg = config_from_hf(OLMO).with_context(S)
    nm = nonmatmul_flops(cfg, S)
    assert nm["layers.*.ln1"].per_layer == 5 * S * 4096 and nm["ln_final"].total == 5 * S * 4096
    assert cfg.architecture.startswith("pre-LayerNorm (no weights)")


# -- the live model -------------------------------------------------------------------------------------
TINY_OLMO = ModelConfig(
    vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=48, norm="layernorm",
    norm_weights=False, tie_embeddings=True, name="tiny-olmo",
)  # fmt: skip


@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(device, seq):
    from lm_accounting.measure.crosscheck import crosscheck

    assert crosscheck(TINY_OLMO, seq, 2, device=device, backward=True).mismatches() == []


def test_live_norm_is_olmos():
    """On CPU: our weightless LayerNorm computes transformers' ``OlmoLayerNorm``."""
    from transformers.models.olmo.modeling_olmo import OlmoLayerNorm

    from lm_accounting.model import build_model

    model = build_model(TINY_OLMO, device="cpu")
    assert not any("ln" in n for n, _ in model.named_parameters())
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.layers[0].ln1(x), OlmoLayerNorm(32)(x))
