"""The component registry is the live model's module tree: same keys, same order, nothing missing."""

import dataclasses

import pytest

from lm_accounting.components import FLOP_GROUPS, REGISTRY, components
from lm_accounting.config import load_config
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


def test_every_component_has_a_formula_text_and_a_known_group():
    for c in REGISTRY:
        quantities = [q for q in ("params", "flops", "elementwise", "saved") if getattr(c, q) is not None]
        assert quantities, c.key
        for q in quantities:
            assert getattr(c, q).text, (c.key, q)
    assert FLOP_GROUPS == ("attention projections", "attention matmuls", "ffn", "lm head")


def test_optional_components_follow_the_config():
    plain, qwen = load_config("gpt2-small"), load_config("qwen3-0.6b")
    assert "layers.*.attn.q_norm" not in [c.key for c in components(plain, "params")]
    assert "layers.*.attn.q_norm" in [c.key for c in components(qwen, "params")]
