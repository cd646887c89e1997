"""The component registry is the live model's module tree: same keys, same order, nothing missing."""

import dataclasses

import pytest

from lm_accounting.components import FLOP_GROUPS, REGISTRY, components
from lm_accounting.config import ModelConfig, load_config
from lm_accounting.measure.flops import analytic_key
from lm_accounting.model import build_model


def live_module_keys(cfg):
    """Module paths of the live model with a parameter or a FLOP-counted matmul, in named_modules() order."""
    model = build_model(cfg)
    keys = []
    for name, module in model.named_modules():
        has_params = any(True for _ in module.parameters(recurse=False))
        if (has_params or type(module).__name__ == "MatMul") and name:
            key, _ = analytic_key(name)
            if key not in keys:
                keys.append(key)
    return keys


@pytest.mark.parametrize("preset", ["gpt2-small", "qwen3-0.6b", "llama-3-8b"])
def test_registry_keys_and_order_are_the_live_modules(preset):
    cfg = dataclasses.replace(load_config(preset), num_layers=2)
    module_keys = [c.key for c in REGISTRY if (c.params or c.flops) and c.present(cfg)]
    if cfg.tie_embeddings:  # a tied LM head is the embedding's Parameter: named_modules still has lm_head
        assert "lm_head" in module_keys
    assert module_keys == live_module_keys(cfg)


TINY = dict(vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=48)
VARIANTS = {  # every architecture option at least once, in the combinations real models use
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
    "gelu-mlp-no-bias": dict(mlp="gelu"),
    "qwen2": dict(qkv_bias=True, num_kv_heads=2),
    "llama-mlp-bias": dict(mlp_bias=True, output_bias=True),
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
        full_attention_every=6,
        scale_embeddings=True,
        qk_norm=True,
        num_kv_heads=1,
        head_dim=16,
        tie_embeddings=True,
    ),
    "olmo2": dict(norm_placement="post", qk_norm=True, qk_norm_scope="projection", num_kv_heads=2),
    "mistral": dict(sliding_window=8, num_kv_heads=2),
    "layernorm-sandwich-geglu-bias": dict(norm="layernorm", norm_placement="sandwich", mlp="geglu", mlp_bias=True),
    "opt-relu": dict(norm="layernorm", mlp="relu", mlp_bias=True, positions="learned", max_position_embeddings=66),
    "nemotron-relu2": dict(norm="layernorm", mlp="relu2", num_kv_heads=2, rotary_dim=4),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_registry_keys_and_order_are_the_live_modules_for_every_architecture_option(variant):
    cfg = ModelConfig(**TINY, **VARIANTS[variant], name=variant)
    module_keys = [c.key for c in REGISTRY if (c.params or c.flops) and c.present(cfg)]
    assert module_keys == live_module_keys(cfg)


def test_every_component_has_a_formula_text_and_a_known_group():
    for c in REGISTRY:
        quantities = [q for q in ("params", "flops", "elementwise", "saved") if getattr(c, q) is not None]
        assert quantities, c.key
        for q in quantities:
            assert getattr(c, q).text, (c.key, q)
    assert FLOP_GROUPS == ("attention projections", "attention matmuls", "linear attention", "ffn", "lm head")


def test_optional_components_follow_the_config():
    plain, qwen = load_config("gpt2-small"), load_config("qwen3-0.6b")
    assert "layers.*.attn.q_norm" not in [c.key for c in components(plain, "params")]
    assert "layers.*.attn.q_norm" in [c.key for c in components(qwen, "params")]


@pytest.mark.parametrize("variant", [*VARIANTS, "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_each_parameter_component_lists_its_tensor_shapes(variant):
    """The registry's stored shapes (what ``analytic.parallel`` shards) hold exactly the parameters its own
    formulas count: per occurrence, tensors × the product of the shape; and the shapes are the live model's."""
    from lm_accounting.analytic.sizes import Sizes

    if variant in VARIANTS:
        cfg = ModelConfig(**TINY, **{**VARIANTS[variant], "tie_embeddings": False}, name=variant)
    else:
        cfg = dataclasses.replace(load_config(variant), tie_embeddings=False)
    z = Sizes(cfg)
    for c in components(cfg, "params"):
        assert c.shape is not None, c.key
        numel = 1
        for n in c.shape(cfg):
            numel *= n
        assert c.tensors(cfg) * numel == c.params.fn(z), c.key
    # by hand: a GPT-2 style block's LayerNorm is two (d,) tensors, its fc bias (d_ff,) cut with fc
    gpt2 = ModelConfig(**TINY, **VARIANTS["openai-gpt2"], name="openai-gpt2")
    ln1, fc_bias = (c for c in REGISTRY if c.key in ("layers.*.ln1", "layers.*.ffn.fc.bias"))
    assert (ln1.tensors(gpt2), ln1.shape(gpt2), ln1.split) == (2, (32,), "replicated")
    assert (fc_bias.shape(gpt2), fc_bias.split) == ((48,), "column")
