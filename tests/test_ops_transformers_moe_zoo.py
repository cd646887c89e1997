"""transformers' other mixtures of experts (``MOE_ZOO``: olmoe, qwen2_moe, granitemoe, granitemoeshared,
glm4_moe, hunyuan_v1_moe, ernie4_5_moe, minimax_m2, hy_v3, gpt_oss, phimoe) replayed by the op library
(``analytic.ops.transformers.PROGRAMS``) equal transformers' own models, phase by phase, byte for byte.

As in tests/test_ops_transformers_moe.py: the experts run transformers' default ``grouped_mm``, whose meta kernel
takes bf16 only, so the traced run is measured by the storage tracker on cpu tensors (fp32, amp-bf16) or on meta
(bf16), and the plain run by the CPU allocator.  Every shape is the slot count T·k whatever the routing, so the
seeded cpu weights' routing stands for any.  The configs are small config.json objects read by
``hf_config.config_from_hf``; widths keep every grouped_mm row a multiple of 16 bytes (the CPU kernel's rule in
bf16).  The lines in B are checked at B = 2 and 3 from one replay, B = 1 by its own replay."""

import pytest

from lm_accounting.analytic.ops import unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from test_ops_transformers_moe import check  # B = 1, 2, 3 against transformers' own model on cpu or meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

SHAPE = dict(
    vocab_size=96,
    hidden_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
    max_position_embeddings=64,
)
MOE_ZOO = {
    # OLMoE: Qwen3-MoE's block (router registered first) under whole-projection q/k norms
    "olmoe": {"num_experts": 4, "intermediate_size": 16, "norm_topk_prob": True},
    "olmoe-unnormalised": {"num_experts": 4, "intermediate_size": 16},
    # Qwen2-MoE: Qwen3-MoE's router and experts, a shared expert gated by a sigmoid; both masks every forward
    "qwen2_moe": {
        "num_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "shared_expert_intermediate_size": 32,
    },
    "qwen2_moe-sparse-step": {
        "num_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "shared_expert_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 2,  # layers 1 and 3 sparse, 0 and 2 dense
    },
    "qwen2_moe-3-experts": {  # 3 experts: the T·k slots not a multiple of E (Qwen1.5-MoE's 60 experts)
        "num_experts": 3,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "shared_expert_intermediate_size": 32,
    },
    # Granite-MoE: Granite's multipliers (the embeddings scaled after the mask), a top-k-then-softmax router
    "granitemoe": {"num_local_experts": 4, "intermediate_size": 16, "embedding_multiplier": 12.0},
    "granitemoe-biased": {"num_local_experts": 4, "intermediate_size": 16, "attention_bias": True},
    # GraniteMoeShared: Granite-MoE's with an ungated shared MLP (fused input_linear)
    "granitemoeshared": {"num_local_experts": 4, "intermediate_size": 16, "shared_intermediate_size": 32},
    # GLM-4-MoE: GLM's partial RoPE, q/k norms once q, k, v are projected, DeepSeek-V3's router and sparse block
    "glm4_moe": {
        "n_routed_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "use_qk_norm": True,
        "attention_bias": True,
        "head_dim": 8,
    },
    "glm4_moe-grouped": {  # 2 groups of 2 experts, 1 kept; no q/k norms; the weights not normalised
        "n_routed_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "n_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "norm_topk_prob": False,
        "first_k_dense_replace": 0,
    },
    # HunYuan-MoE: HunYuan-Dense's attention (q/k norms after RoPE), an fp32 router, an ungated shared MLP
    "hunyuan_v1_moe": {"num_experts": 4, "moe_topk": 2, "intermediate_size": 16, "head_dim": 4},
    "hunyuan_v1_moe-biased": {
        "num_experts": 4,
        "moe_topk": 2,
        "intermediate_size": 16,
        "head_dim": 4,
        "attention_bias": True,
    },
    # ERNIE 4.5-MoE: ERNIE 4.5's attention, an fp32 router with a frozen score bias and a clamped normalisation
    "ernie4_5_moe": {
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "moe_num_shared_experts": 2,
        "moe_layer_start_index": 1,
    },
    "ernie4_5_moe-unshared": {
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "moe_num_shared_experts": 0,
        "moe_layer_start_index": 0,
        "moe_layer_interval": 2,
        "tie_word_embeddings": False,
    },
    "ernie4_5_moe-biased": {  # use_bias: q/k/v/o, the dense and shared MLPs and the (tied) LM head
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "moe_num_shared_experts": 1,
        "use_bias": True,
    },
    # MiniMax-M2: OLMoE's whole-projection q/k norms with RoPE on rotary_dim, a sigmoid router with a score bias
    "minimax_m2": {"num_local_experts": 4, "intermediate_size": 16, "head_dim": 8, "rotary_dim": 4},
    # Hunyuan v3: q/k norms on the transposed states, an fp32 sigmoid router, shared experts summed in fp32
    "hy_v3": {
        "num_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "num_shared_experts": 1,
        "head_dim": 4,
        "attention_bias": True,
    },
    "hy_v3-combined-in-dtype": {  # enable_moe_fp32_combine false; every layer sparse; MLP biases
        "num_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "num_shared_experts": 2,
        "head_dim": 4,
        "enable_moe_fp32_combine": False,
        "mlp_layer_types": ["sparse"] * 4,
        "mlp_bias": True,
    },
    # gpt-oss: sinks, biased experts (transposed weights) with a clamped SwiGLU, windows on every other layer
    "gpt_oss": {"num_local_experts": 4, "intermediate_size": 16, "head_dim": 4, "sliding_window": 10},
    "gpt_oss-unbiased": {
        "num_local_experts": 4,
        "intermediate_size": 16,
        "head_dim": 8,
        "sliding_window": 4,
        "attention_bias": False,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    },
    # PhiMoE: LayerNorms, the rotary table recomputed every forward, the sparsemixer router (Gumbel top-2)
    "phimoe": {"num_local_experts": 4, "intermediate_size": 16},
    "phimoe-windowed": {"num_local_experts": 4, "intermediate_size": 16, "sliding_window": 4, "attention_bias": True},
}


def tiny(name: str):
    return config_from_hf({"model_type": name.split("-")[0], **SHAPE, **MOE_ZOO[name]})


SETUPS = {
    "sdpa-fp32": (TrainingSetup(attention="sdpa"), "cpu"),
    "eager-amp-full": (TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full"), "cpu"),
    "sdpa-bf16-full-meta": (TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full"), "meta"),
}


def refusal(name: str, setup: TrainingSetup) -> str | None:
    """The one reason a type's program gives for a setup it does not cover, else None."""
    model_type = name.split("-")[0]
    if model_type == "gpt_oss" and setup.attention != "naive":  # GptOssPreTrainedModel._supports_sdpa = False
        return "gpt-oss with sdpa (transformers' GptOssForCausalLM supports eager attention only here)"
    return None


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("name", list(MOE_ZOO))
def test_moe_zoo_equals_transformers_under_the_tracker(name, setup):
    setup, device = SETUPS[setup]
    reason = refusal(name, setup)
    if reason is not None:
        assert unsupported(tiny(name), setup, "transformers") == [reason]
        return
    check(tiny(name), 8, setup, device=device)


@pytest.mark.parametrize(
    "name, setup",
    [
        ("olmoe", TrainingSetup(attention="sdpa")),
        ("olmoe", TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
        ("qwen2_moe", TrainingSetup(attention="sdpa", precision="amp-bf16")),
        ("qwen2_moe-sparse-step", TrainingSetup(attention="naive", checkpoint="full")),
        ("granitemoe", TrainingSetup(attention="sdpa", precision="bf16")),
        ("granitemoeshared", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
        ("glm4_moe", TrainingSetup(attention="sdpa")),
        ("glm4_moe-grouped", TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
        ("hunyuan_v1_moe", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
        ("ernie4_5_moe", TrainingSetup(attention="naive", checkpoint="full")),
        # the router in an autocast-off region (``maybe_autocast(enabled=False)``): an fp32 F.linear
        ("ernie4_5_moe-biased", TrainingSetup(attention="sdpa", precision="amp-bf16")),
        ("minimax_m2", TrainingSetup(attention="sdpa", precision="amp-bf16")),
        ("hy_v3", TrainingSetup(attention="naive", precision="bf16")),
        ("hy_v3-combined-in-dtype", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
        ("gpt_oss", TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
        ("phimoe", TrainingSetup(attention="sdpa")),
        ("phimoe-windowed", TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v.to_dict().values()),
)
def test_moe_zoo_plain_cpu_run_equals_the_cpu_allocator(name, setup):
    for batch in (1, 2):
        check_plain(tiny(name), 8, batch, setup)


GRID = [
    (name, TrainingSetup(attention=a, precision=p, checkpoint=c))
    for name in MOE_ZOO
    for a in ("naive", "sdpa")
    for p in ("fp32", "bf16", "amp-bf16")
    for c in ("none", "full")
]


@pytest.mark.grid
@pytest.mark.parametrize(
    "name, setup",
    [(n, s) for n, s in GRID if refusal(n, s) is None],
    ids=lambda v: v if isinstance(v, str) else "-".join(v.to_dict().values()),
)
def test_moe_zoo_grid(name, setup):
    check(tiny(name), 8, setup)


def test_gpt_oss_sdpa_is_refused_by_transformers_too():
    """The program's refusal is transformers' own: ``from_config`` with sdpa raises for gpt-oss."""
    from lm_accounting.config import AccountingError
    from lm_accounting.measure.hf import measure_hf_step

    with pytest.raises(AccountingError, match="GptOssForCausalLM does not support an attention implementation"):
        measure_hf_step(tiny("gpt_oss"), 8, 1, TrainingSetup(attention="sdpa"), device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, attention",
    [
        ("OLMoE-1B-7B-0924", "sdpa"),
        ("granite-3.1-3b-a800m-instruct", "naive"),
        ("qwen1.5-moe-a2.7b", "sdpa"),  # 60 experts: the slots not a multiple of E
        ("gpt-oss-20b", "naive"),
    ],
)
def test_published_sizes_equal_transformers_on_meta(name, attention):
    """Full-size published configs in bf16 on meta (the grouped_mm meta kernel's dtype), B = 1 at 256 tokens."""
    from test_hf_zoo import PUBLISHED

    from lm_accounting.analytic.ops import predict_step
    from lm_accounting.config import load_config
    from lm_accounting.measure.hf import measure_hf_step

    cfg = config_from_hf(PUBLISHED[name]) if name in PUBLISHED else load_config(name)
    setup = TrainingSetup(attention=attention, precision="bf16")
    predicted = predict_step(cfg, 256, setup, impl="transformers", batch=1).at(1)
    assert predicted == measure_hf_step(cfg, 256, 1, setup, device="meta")
