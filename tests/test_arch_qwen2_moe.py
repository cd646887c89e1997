"""Qwen2-MoE (Qwen1.5-MoE): the shared expert behind its own sigmoid gate, exact against transformers 5.24.

``Qwen2MoeSparseMoeBlock`` (transformers' models/qwen2_moe/modeling_qwen2_moe.py) runs the routed experts and
one shared expert (``Qwen2MoeMLP`` of ``shared_expert_intermediate_size``) on every token, and scales the shared
expert's output by ``sigmoid(shared_expert_gate(x))``, ``shared_expert_gate = nn.Linear(d, 1, bias=False)``:
d parameters and 2·T·d matmul FLOPs per sparse layer (our ``moe.shared_gate``).  Layer i is sparse when
(i + 1) % ``decoder_sparse_step`` == 0 and i is not in ``mlp_only_layers``.

The published config.json of Qwen/Qwen1.5-MoE-A2.7B is written out below (offline machine); a second case
(``decoder_sparse_step`` 2, so every other layer keeps a dense FFN of ``intermediate_size``) is the same
file with 4 layers.  Method as tests/test_transformers_truth.py: transformers' model on meta, eager attention,
``experts_implementation="batched_mm"``, parameters by name, FlopCounterMode at 1,024 and 4,096 tokens.
"""

import pytest

from lm_accounting.analytic.flops import forward_flops, nonmatmul_flops
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

QWEN15_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B/config.json
    "model_type": "qwen2_moe",
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 8192,
    "max_window_layers": 21,
    "moe_intermediate_size": 1408,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
CONFIGS = {
    "qwen1.5-moe-a2.7b": QWEN15_MOE,
    "qwen2-moe-sparse-step-2": {**QWEN15_MOE, "num_hidden_layers": 4, "decoder_sparse_step": 2},
}

LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "mlp.gate_proj": ("ffn.w1",),  # a dense layer
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
    "mlp.gate": ("moe.router",),
    "mlp.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),  # FLOPs: one module
    "mlp.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "mlp.experts.down_proj": ("moe.experts.w2",),
    "mlp.shared_expert.gate_proj": ("moe.shared.w1",),
    "mlp.shared_expert.up_proj": ("moe.shared.w3",),
    "mlp.shared_expert.down_proj": ("moe.shared.w2",),
    "mlp.shared_expert_gate": ("moe.shared_gate",),
}
TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
PREFIX = "model.layers."


def our_keys(name: str) -> tuple[str, ...]:
    if name.removesuffix(".weight") in TOP:
        return (TOP[name.removesuffix(".weight")],)
    inner = name[len(PREFIX) :].partition(".")[2]
    if inner in LAYER_MAP:
        return tuple(f"layers.*.{k}" for k in LAYER_MAP[inner])
    module, _, kind = inner.rpartition(".")
    keys = LAYER_MAP[module]
    bias = ".bias" if kind == "bias" else ""
    return tuple(f"layers.*.{k}{bias}" for k in keys)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, our_keys)


def test_published_totals():
    """Qwen1.5-MoE-A2.7B's model card: "14.3B parameters in total and 2.7B activated parameters during runtime"
    (the activated count with the embedding table and the LM head, unlike OpenAI's for gpt-oss)."""
    cfg = config_from_hf(QWEN15_MOE)
    assert f"{parameter_breakdown(cfg).total / 1e9:.1f}B" == "14.3B"
    assert f"{active_parameter_count(cfg) / 1e9:.1f}B" == "2.7B"


def test_parameters_by_hand():
    """One sparse layer of Qwen1.5-MoE-A2.7B from the shapes in modeling_qwen2_moe.py, written out."""
    V, d, L, E, f, fs = 151936, 2048, 24, 60, 1408, 5632
    attention = 3 * (d * d + d) + d * d  # q, k, v with biases (qkv_bias), o without
    moe = E * d + E * 3 * d * f + 3 * d * fs + d  # router, experts, shared expert, shared_expert_gate
    total = 2 * V * d + L * (attention + 2 * d + moe) + d
    assert parameter_breakdown(config_from_hf(QWEN15_MOE)).total == total == 14_315_784_192


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 4096])
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    counted = hf_forward_flops(models[name], seq)
    fwd = forward_flops(cfg, seq)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, PREFIX, "self_attn")
    assert fwd["layers.*.moe.shared_gate"].total == cfg.moe_layers * 2 * seq * cfg.d_model


def test_shared_gate_convention():
    """σ on one value per token (3 FLOPs: negate-exp, add 1, divide) and the shared output scaled by it (T·d)."""
    S = 512
    nm = nonmatmul_flops(config_from_hf(QWEN15_MOE).with_context(S), S)
    assert nm["layers.*.moe.shared_gate"].per_layer == 3 * S + S * 2048


def test_mlp_only_layers_and_gate_without_shared_expert_are_one_line():
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        config_from_hf({**QWEN15_MOE, "mlp_only_layers": [0]})
    with pytest.raises(ConfigError, match="shared_expert_intermediate_size"):
        config_from_hf({**QWEN15_MOE, "shared_expert_intermediate_size": 0})
    with pytest.raises(ConfigError, match="shared_expert_gate gates the shared experts"):
        ModelConfig(
            vocab_size=10, context_length=8, num_layers=2, d_model=8, num_heads=2, d_ff=8, num_experts=4,
            experts_per_token=2, shared_expert_gate=True,
        )  # fmt: skip


# -- the live model: moe.shared_gate, cross-checked ------------------------------------------------------
TINY_QWEN2_MOE = ModelConfig(
    vocab_size=97, context_length=64, num_layers=4, d_model=32, num_heads=4, d_ff=48, qkv_bias=True, num_experts=4,
    experts_per_token=2, expert_d_ff=16, shared_experts=1, shared_expert_d_ff=40, shared_expert_gate=True,
    moe_every=2, name="tiny-qwen2-moe",
)  # fmt: skip


@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(device, seq):
    from lm_accounting.measure.crosscheck import crosscheck

    assert crosscheck(TINY_QWEN2_MOE, seq, 2, device=device, backward=True).mismatches() == []


def test_live_model_parameters_follow_the_registry():
    from lm_accounting.analytic.parallel import parameter_shapes
    from lm_accounting.model import build_model

    live = [(n, tuple(p.shape)) for n, p in build_model(TINY_QWEN2_MOE).named_parameters()]
    assert live == [(p.name, p.shape) for p in parameter_shapes(TINY_QWEN2_MOE)]
    assert ("layers.1.moe.shared_gate.weight", (1, 32)) in live and not any(
        n.startswith("layers.0.moe") for n, _ in live
    )


def test_shared_gate_scales_the_shared_expert():
    """On CPU: a gate whose weights are zero halves the shared expert's output (σ(0) = 1/2)."""
    from lm_accounting.model import build_model

    block = build_model(TINY_QWEN2_MOE, device="cpu").layers[1].moe
    x = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        block.shared_gate.weight.zero_()
        gated = block(x)
        block.shared_gate = None
        ungated = block(x)
        half = block.shared(x.reshape(5, 32)).reshape(1, 5, 32) / 2
    torch.testing.assert_close(ungated - gated, half)


def test_preset_is_its_config_json():
    from lm_accounting.config import load_config

    from_json = config_from_hf(QWEN15_MOE, name="qwen1.5-moe-a2.7b").resolved()
    assert {**from_json, "ignored_fields": []} == load_config("qwen1.5-moe-a2.7b").resolved()
    assert load_config("qwen1.5-moe-a2.7b").hf_model_type == "qwen2_moe"
