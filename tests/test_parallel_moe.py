"""Mixture-of-experts and latent-attention (MLA) models in parallel layouts: the parameter list against
the live model, DDP / ZeRO-1 / FSDP2 model states and collectives against one rank of the real job on
torch's fake process group, and expert parallel."""

import dataclasses

import pytest

from lm_accounting.analytic.parallel import parameter_shapes, stage_parameters
from lm_accounting.config import ModelConfig, load_config

TINY = dict(vocab_size=101, context_length=16, d_model=24, num_heads=4, d_ff=40)
MIXTRAL = ModelConfig(**TINY, num_layers=2, num_kv_heads=2, num_experts=4, experts_per_token=2, name="tiny-mixtral")
QWEN3_MOE = ModelConfig(
    **TINY, num_layers=3, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=6, experts_per_token=2,
    expert_d_ff=12, moe_every=2, tie_embeddings=True, name="tiny-qwen3-moe",
)  # fmt: skip
DEEPSEEK = ModelConfig(
    **TINY, num_layers=3, num_experts=5, experts_per_token=3, expert_d_ff=8, shared_experts=2, dense_layers_first=1,
    kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, name="tiny-deepseek",
)  # fmt: skip
DEEPSEEK_LITE = dataclasses.replace(DEEPSEEK, q_lora_rank=None, shared_experts=1, name="tiny-deepseek-lite")
CONFIGS = [MIXTRAL, QWEN3_MOE, DEEPSEEK, DEEPSEEK_LITE]


def _live(cfg):
    from lm_accounting.model import build_model

    return [(n, tuple(p.shape)) for n, p in build_model(cfg, "meta").named_parameters()]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_parameter_shapes_are_the_live_models(cfg):
    """Names, shapes and order equal ``named_parameters()`` of the live model built on meta."""
    pytest.importorskip("torch")
    assert [(p.name, p.shape) for p in parameter_shapes(cfg)] == _live(cfg)


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "openai-gpt2", "llama-3-8b"])
def test_parameter_shapes_of_the_presets(preset):
    """The presets' whole layer patterns (DeepSeek's 3 dense blocks first), on 4-layer meta builds; and
    the other architecture options (GPT-2: learned positions, LayerNorm, biases, GELU MLP, tied)."""
    pytest.importorskip("torch")
    cfg = dataclasses.replace(load_config(preset), num_layers=4)
    assert [(p.name, p.shape) for p in parameter_shapes(cfg)] == _live(cfg)


def test_expert_stacks_by_hand():
    # Mixtral-8x7B: each MoE block holds w1, w3 (8, 14336, 4096) and w2 (8, 4096, 14336), and the
    # router (8, 4096).
    shapes = {p.name: p.shape for p in parameter_shapes(load_config("mixtral-8x7b"))}
    assert shapes["layers.31.moe.experts.w1.weight"] == (8, 14336, 4096)
    assert shapes["layers.31.moe.experts.w2.weight"] == (8, 4096, 14336)
    assert shapes["layers.0.moe.router.weight"] == (8, 4096)
    # DeepSeek-V3: kv_b_proj (128·(128 + 128), 512), kv_a_proj (512 + 64, 7168), one shared expert
    # of 2048; blocks 0-2 dense (ffn.w1 (18432, 7168)), 3-60 MoE.
    shapes = {p.name: p.shape for p in parameter_shapes(load_config("deepseek-v3"))}
    assert shapes["layers.5.attn.kv_b_proj.weight"] == (32768, 512)
    assert shapes["layers.5.attn.kv_a_proj.weight"] == (576, 7168)
    assert shapes["layers.5.moe.shared.w1.weight"] == (2048, 7168)
    assert shapes["layers.2.ffn.w1.weight"] == (18432, 7168) and "layers.3.ffn.w1.weight" not in shapes


def test_pipeline_stages_keep_every_parameter_once():
    """Stage 0 starts with the embedding, the last stage ends with the final norm and the (tied: a
    second copy of the) LM head; the blocks are split 2 + 1."""
    first, last = stage_parameters(QWEN3_MOE, 2, 0), stage_parameters(QWEN3_MOE, 2, 1)
    assert first[0].name == "token_embeddings.weight" and {p.unit for p in first[1:]} == {1, 2}
    assert [p.name for p in last[-2:]] == ["ln_final.weight", "lm_head.weight"] and {p.unit for p in last[:-2]} == {3}
