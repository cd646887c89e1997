"""Ernie 4.5-MoE (transformers' models/ernie4_5_moe): the frozen router score bias, the shared experts' biases
and the LM-head bias, exact against transformers 5.24.

``Ernie4_5_MoeTopKRouter`` holds ``moe_statics.e_score_correction_bias``, E values added to the router's
probabilities to pick the top k, a parameter with ``requires_grad=False``: ``parameters()`` counts it (so do we:
``router_score_bias``, component ``moe.score_bias``), but it has no gradient and no AdamW state (our model states
leave it out: ``frozen_parameter_count``).  With ``use_bias = true`` q/k/v/o, the dense MLP, the shared experts
(``Ernie4_5_MoeMLP``) and the LM head (``nn.Linear(d, V, bias=config.use_bias)``; tied, it shares only the
weight) have biases; the routed experts have none.  Ours: ``qkv_bias``, ``output_bias``, ``mlp_bias`` (dense FFNs
and shared experts), ``lm_head_bias``.

Configs: baidu/ERNIE-4.5-21B-A3B-PT's config.json (offline machine: written out below; layer 0 dense, 27 MoE
layers of 64 experts of 1,536, top-6, 2 shared), and the same with ``use_bias = true`` and 3 layers.  Method as
tests/test_transformers_truth.py: transformers' model on meta, eager attention, ``experts_implementation=
"batched_mm"``, parameters by name, FlopCounterMode at 1,024 and 2,048 tokens.
"""

import pytest

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.memory import model_state_breakdown, parameter_tensor_count, parameter_tensor_sizes
from lm_accounting.analytic.params import active_parameter_count, frozen_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

ERNIE = {  # baidu/ERNIE-4.5-21B-A3B-PT/config.json
    "model_type": "ernie4_5_moe",
    "architectures": ["Ernie4_5_MoeForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "max_position_embeddings": 131072,
    "num_attention_heads": 20,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "rms_norm_eps": 1e-05,
    "use_cache": False,
    "vocab_size": 103424,
    "rope_theta": 500000,
    "use_bias": False,
    "tie_word_embeddings": True,
    "moe_num_experts": 64,
    "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1,
    "moe_intermediate_size": 1536,
    "moe_k": 6,
    "moe_layer_interval": 1,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
CONFIGS = {
    "ernie-4.5-21b-a3b": ERNIE,
    "ernie-4.5-moe-biases": {**ERNIE, "num_hidden_layers": 3, "use_bias": True},
}

LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "mlp.gate_proj": ("ffn.w1",),
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
    "mlp.gate": ("moe.router",),
    "mlp.gate.moe_statics.e_score_correction_bias": ("moe.score_bias",),
    "mlp.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "mlp.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "mlp.experts.down_proj": ("moe.experts.w2",),
    "mlp.shared_experts.gate_proj": ("moe.shared.w1",),
    "mlp.shared_experts.up_proj": ("moe.shared.w3",),
    "mlp.shared_experts.down_proj": ("moe.shared.w2",),
}
TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
PREFIX = "model.layers."


def our_keys(name: str) -> tuple[str, ...]:
    module, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        module, kind = name, "weight"
    bias = ".bias" if kind == "bias" else ""
    if module in TOP:
        return (TOP[module] + bias,)
    keys = LAYER_MAP[module[len(PREFIX) :].partition(".")[2]]
    return tuple(f"layers.*.{k}{bias if not k.startswith('ln') else ''}" for k in keys)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, our_keys, with_empty=False)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen_parameter_count(cfg) == frozen == cfg.moe_layers * 64
    assert parameter_tensor_count(cfg, "transformers", trained=True) == sum(
        1 for p in model.parameters() if p.requires_grad
    )
    assert parameter_tensor_sizes(cfg, implementation="transformers") == [p.numel() for p in model.parameters()]


def test_published_totals_and_model_states():
    """ERNIE-4.5-21B-A3B: "21B total parameters, 3B activated" (the model's name and card, truncated); the model
    states leave the 27 frozen score biases of 64 out of the gradients and the moments."""
    cfg = config_from_hf(ERNIE)
    total, active = parameter_breakdown(cfg).total, active_parameter_count(cfg)
    assert (total, active) == (21_825_437_888, 3_352_150_208)
    assert (total // 10**9, active // 10**9) == (21, 3)
    states = {it.key: it.total for it in model_state_breakdown(cfg, "fp32")}
    assert states["parameters"] == 4 * total and states["gradients"] == 4 * (total - 27 * 64)


def test_biases_with_use_bias():
    bd = parameter_breakdown(config_from_hf(CONFIGS["ernie-4.5-moe-biases"]))
    assert bd["lm_head.bias"].total == 103424 and bd["lm_head"].total == 0
    assert bd["layers.*.moe.shared.w2.bias"].per_layer == 2560 and "layers.*.moe.experts.w1.bias" not in bd.totals()


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 2048])
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    counted = hf_forward_flops(models[name], seq)
    fwd = forward_flops(config_from_hf(CONFIGS[name], name=name).with_context(seq), seq)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, PREFIX, "self_attn")


def test_a_moe_that_stops_before_the_last_layer_is_refused():
    with pytest.raises(ConfigError, match="moe_layer_end_index"):
        config_from_hf({**ERNIE, "moe_layer_end_index": 20})


@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(device, seq):
    """The live model with the frozen score bias, an LM-head bias (tied weight) and biased shared experts."""
    import dataclasses

    from lm_accounting.measure.crosscheck import crosscheck

    tiny = dataclasses.replace(
        config_from_hf(CONFIGS["ernie-4.5-moe-biases"]), vocab_size=97, context_length=64, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48, num_experts=4,
        head_dim=None, experts_per_token=2, expert_d_ff=16, name="tiny-ernie",
    )  # fmt: skip
    assert crosscheck(tiny, seq, 2, device=device, backward=True).mismatches() == []
