"""The model zoo (issue 30): each model_type added to the reader, proven against transformers' own model.

For every type of ``hf_config.SUPPORTED_MODEL_TYPES`` added by the zoo, a small config.json (a few layers and
small widths, the type's published options: biases, windows, experts, norms) goes two ways, as in
tests/test_transformers_truth.py: ``config_from_hf`` -> our counts, and ``AutoConfig.for_model`` ->
``AutoModelForCausalLM.from_config(..., attn_implementation="eager")`` on meta -> ``parameters()`` per
component and ``FlopCounterMode`` over one forward at two lengths, the second past the sliding window.
One published full-size config.json per family (written out below; this machine is offline) is read and
compared the same way, marked slow.
"""

import re
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ConfigError
from lm_accounting.hf_config import config_from_hf
from lm_accounting.hf_fields import DEFINED_FIELDS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from test_transformers_truth import GPT2_MODULES, LLAMA_MODULES, TOP, build_hf, hf_forward_flops

NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    **NO_IDS,
}
WINDOW = 128
SEQS = (64, 256)  # the second past every window below
EXPERTS = {"num_experts_per_tok": 2}

ZOO = {  # model_type -> a small config.json with the type's own options set
    "granite": {
        **SMALL,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125,
        "logits_scaling": 16.0,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    "granitemoe": {**SMALL, **EXPERTS, "num_local_experts": 4, "embedding_multiplier": 12.0},
    "granitemoeshared": {**SMALL, **EXPERTS, "num_local_experts": 4, "shared_intermediate_size": 48},
    "helium": {**SMALL, "head_dim": 16, "attention_bias": True},  # on q, k and v: its o_proj has none
    "internlm3": {**SMALL, "head_dim": 16, "qkv_bias": True, "bias": True},
    "exaone": {**SMALL, "num_layers": 4, "activation_function": "silu", "layer_norm_epsilon": 1e-5},
    "ernie4_5": {**SMALL, "head_dim": 16, "use_bias": True},
    "seed_oss": {**SMALL, "head_dim": 32, "attention_bias": True, "attention_out_bias": False},
    "ministral": {**SMALL, "head_dim": 16, "sliding_window": WINDOW},
    "ministral3": {**SMALL, "head_dim": 32},
    "smollm3": {**SMALL, "no_rope_layer_interval": 4, "tie_word_embeddings": True},
    "hunyuan_v1_dense": {**SMALL, "head_dim": 16},
    "gemma": {**SMALL, "head_dim": 32},
    "olmo3": {**SMALL, "sliding_window": WINDOW},
    "exaone4": {**SMALL, "sliding_window": WINDOW, "sliding_window_pattern": 4},
    "olmoe": {**SMALL, **EXPERTS, "num_experts": 4},
    "phimoe": {**SMALL, **EXPERTS, "num_local_experts": 4, "attention_bias": True, "sliding_window": WINDOW},
    "hy_v3": {
        **SMALL,
        **EXPERTS,
        "head_dim": 16,
        "num_experts": 4,
        "moe_intermediate_size": 32,
        "num_shared_experts": 2,
    },
    "hunyuan_v1_moe": {**SMALL, "head_dim": 16, "num_experts": 4, "moe_topk": [2, 2, 2, 2]},
    "iquestcoder": {**SMALL, "head_dim": 32},
    "sarvam_mla": {
        **SMALL,
        **EXPERTS,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "moe_intermediate_size": 32,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
    },
    "youtu": {
        **SMALL,
        "num_key_value_heads": 4,
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
    },
    "vaultgemma": {**SMALL, "head_dim": 32, "sliding_window": WINDOW},
    "hyperclovax": {**SMALL, "embedding_multiplier": 2.0, "attention_multiplier": 0.1, "mlp_bias": True},
    "glm4_moe_lite": {
        **SMALL,
        **EXPERTS,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "moe_intermediate_size": 32,
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
    },
    "starcoder2": {**SMALL, "sliding_window": WINDOW},
    "gpt_bigcode": {"vocab_size": 256, "n_embd": 64, "n_layer": 4, "n_head": 4, "n_positions": 512, **NO_IDS},
    # partial rotary (RoPE on the first rotary_dim of each head): GLM, MiniMax-M2, StableLM
    "glm4_moe": {
        **SMALL,
        **EXPERTS,
        "head_dim": 24,  # heads · head_dim != hidden_size, as GLM-4.5's 96 · 128 vs 5,120
        "n_routed_experts": 4,
        "moe_intermediate_size": 32,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "use_qk_norm": True,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
    },
    "minimax_m2": {**SMALL, **EXPERTS, "head_dim": 32, "num_local_experts": 4, "rotary_dim": 8},
    "glm4": {**SMALL, "head_dim": 16, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}},
    "glm": {**SMALL, "head_dim": 20, "attention_bias": False},  # the class's 0.5: 10 of 20
    "stablelm": {**SMALL, "use_qkv_bias": True},  # the class's 0.25: 4 of 16
}

# transformers' module names -> our component keys, beyond tests/test_transformers_truth.py's
ZOO_MODULES = {
    **LLAMA_MODULES,
    "self_attn.query_layernorm": ("attn.q_norm",),
    "self_attn.key_layernorm": ("attn.k_norm",),
    "mlp.router": ("moe.router",),
    "mlp.gate.wg": ("moe.router",),
    "mlp.shared_mlp.gate_proj": ("moe.shared.w1",),
    "mlp.shared_mlp.up_proj": ("moe.shared.w3",),
    "mlp.shared_mlp.down_proj": ("moe.shared.w2",),
    "block_sparse_moe.router": ("moe.router",),
    "block_sparse_moe.router.layer": ("moe.router",),
    "block_sparse_moe.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "block_sparse_moe.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "block_sparse_moe.experts.down_proj": ("moe.experts.w2",),
    "shared_mlp.input_linear": ("moe.shared.w1", "moe.shared.w3"),
    "shared_mlp.output_linear": ("moe.shared.w2",),
    "mlp.c_fc": ("ffn.fc",),
    "mlp.c_proj": ("ffn.proj",),
    "post_self_attn_layernorm": ("post_attn_norm",),  # GLM-4-0414's sandwich norms
    "post_mlp_layernorm": ("post_ffn_norm",),
}
POST_NORMS = {"post_attention_layernorm": ("post_attn_norm",)}  # OLMo-3, EXAONE 4: after the sublayers
PERI_NORMS = {"post_norm1": ("post_attn_norm",), "post_norm2": ("post_ffn_norm",)}  # HyperCLOVA X
LAYER = re.compile(r"^(?:model\.layers|transformer\.h)\.\d+\.(.+)$")


def zoo_keys(model_type: str, module: str, suffix: str = "") -> tuple[str, ...]:
    if module in TOP:
        return (TOP[module],)
    match = LAYER.match(module)
    assert match, module
    table = GPT2_MODULES if model_type == "gpt_bigcode" else ZOO_MODULES
    if model_type in ("olmo3", "exaone4"):
        table = {**table, **POST_NORMS}
    if model_type == "hyperclovax":
        table = {**table, **PERI_NORMS}
    inner = table[match.group(1)]
    bias = suffix if not inner[0].startswith(("ln", "post_")) else ""
    return tuple(f"layers.*.{k}{bias}" for k in inner)


def hf_params_by_component(model, model_type: str) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = defaultdict(int)
    for name, param in model.named_parameters():
        module, _, kind = name.rpartition(".")
        if kind not in ("weight", "bias"):
            module, kind = name, "weight"
        out[zoo_keys(model_type, module, ".bias" if kind == "bias" else "")] += param.numel()
    return dict(out)


def check_parameters(model_type: str, values: dict) -> None:
    cfg = config_from_hf({"model_type": model_type, **values})
    assert cfg.hf_model_type == model_type
    model = build_hf({"model_type": model_type, **values})
    bd = parameter_breakdown(cfg)
    assert bd.total == sum(p.numel() for p in model.parameters())
    for keys, count in hf_params_by_component(model, model_type).items():
        assert sum(bd[k].total for k in keys) == count, (keys, count)


def check_flops(model_type: str, values: dict, seq: int) -> None:
    cfg = config_from_hf({"model_type": model_type, **values}).with_context(seq)
    model = build_hf({"model_type": model_type, **values})
    counted = hf_forward_flops(model, seq)
    fwd = forward_flops(cfg, seq)
    assert counted["total"] == fwd.total
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    core = 0
    for module, flops in counted.items():
        if module in TOP:
            by_keys[zoo_keys(model_type, module)] += flops
            continue
        match = LAYER.match(module)
        if not match:
            continue
        inner = match.group(1)
        children = [k for k in counted if k.startswith(module + ".")]
        if inner in ("self_attn", "attn"):
            direct = [k for k in children if k.count(".") == module.count(".") + 1]
            core += flops - sum(counted[k] for k in direct)
        elif (
            inner.split(".")[0] in ("self_attn", "attn", "mlp", "block_sparse_moe")
            and "." in inner
            and not children
            and not inner.endswith(("_norm", "layernorm"))
        ):
            by_keys[zoo_keys(model_type, module)] += flops
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert core == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total


def test_every_supported_model_type_is_proven_here_or_in_the_truth_tests():
    """The first 13 in tests/test_transformers_truth.py, the zoo's mappings here, the types with pieces of their
    own in tests/test_gpt_oss.py and tests/test_arch_*.py."""
    from test_arch_bloom import CONFIGS as BLOOM
    from test_arch_dsa import TINY_CONFIGS as DSA
    from test_arch_ernie4_5_moe import CONFIGS as ERNIE
    from test_arch_lfm2 import TINY_CONFIGS as LFM2
    from test_arch_llama4 import CONFIGS as LLAMA4
    from test_arch_mamba import TINY_CONFIGS as SSM
    from test_arch_mamba2 import TINY_CONFIGS as MAMBA2
    from test_arch_olmo import CONFIGS as OLMO
    from test_arch_parallel_block import CONFIGS as PARALLEL
    from test_arch_qwen2_moe import CONFIGS as QWEN2_MOE
    from test_arch_qwen3_next import TINY_CONFIGS as HYBRIDS
    from test_arch_relu import CONFIGS as RELU
    from test_gpt_oss import CONFIGS as GPT_OSS
    from test_transformers_truth import CONFIGS

    from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES

    first = {values["model_type"] for values, _ in CONFIGS.values()}
    pieces = {c["model_type"] for c, _ in [*GPT_OSS.values(), *BLOOM.values()]}
    pieces |= {c["model_type"] for c in [*QWEN2_MOE.values(), *OLMO.values(), *ERNIE.values()]}
    pieces |= {c["model_type"] for c in [*HYBRIDS.values(), *RELU.values(), *DSA.values()]}
    pieces |= {c["model_type"] for c in LLAMA4.values()}
    pieces |= {c["model_type"] for c in MAMBA2.values()}
    pieces |= {c["model_type"] for c in LFM2.values()}
    pieces |= {c["model_type"] for c in SSM.values()}
    pieces |= {c["model_type"] for c in PARALLEL.values()} - set(ZOO)  # StableLM's parallel variant: a ZOO type
    assert first | set(ZOO) | pieces == set(SUPPORTED_MODEL_TYPES)
    assert not first & set(ZOO) and not pieces & (first | set(ZOO))
    assert {values["model_type"] for values in PUBLISHED.values()} <= set(ZOO)


@pytest.fixture
def meta_masks(monkeypatch):
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda *args, **kwargs: None)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ZOO)
def test_zoo_parameters_equal_transformers(model_type):
    check_parameters(model_type, ZOO[model_type])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ZOO)
@pytest.mark.parametrize("seq", SEQS)
def test_zoo_forward_flops_equal_transformers(model_type, seq, meta_masks):
    check_flops(model_type, ZOO[model_type], seq)


# -- published full-size config.json files (written out from the hub files; the machine is offline) ----------
PUBLISHED = {
    "SmolLM3-3B": {
        "model_type": "smollm3",
        "architectures": ["SmolLM3ForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 128256,
        "max_position_embeddings": 65536,
        "rope_theta": 5000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "no_rope_layer_interval": 4,
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 128012,
        "pad_token_id": 128004,
    },
    "OLMoE-1B-7B-0924": {
        "model_type": "olmoe",
        "architectures": ["OlmoeForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "vocab_size": 50304,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05,
        "clip_qkv": None,
        "norm_topk_prob": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.01,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "eos_token_id": 50279,
        "pad_token_id": 1,
        "torch_dtype": "bfloat16",
    },
    "granite-3.1-8b-instruct": {
        "model_type": "granite",
        "architectures": ["GraniteForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 12800,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 49155,
        "max_position_embeddings": 131072,
        "rope_theta": 10000000.0,
        "rms_norm_eps": 1e-05,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125,
        "logits_scaling": 16.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    },
    "granite-3.1-3b-a800m-instruct": {
        "model_type": "granitemoe",
        "architectures": ["GraniteMoeForCausalLM"],
        "hidden_size": 1536,
        "intermediate_size": 512,
        "num_hidden_layers": 32,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "num_local_experts": 40,
        "num_experts_per_tok": 8,
        "vocab_size": 49155,
        "max_position_embeddings": 131072,
        "rope_theta": 10000000.0,
        "rms_norm_eps": 1e-06,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625,
        "logits_scaling": 6.0,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    },
    "OLMo-3-7B": {
        "model_type": "olmo3",
        "architectures": ["Olmo3ForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 100278,
        "max_position_embeddings": 65536,
        "rope_theta": 500000,
        "rms_norm_eps": 1e-06,
        "sliding_window": 4096,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 8,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "pad_token_id": 100277,
        "eos_token_id": 100257,
    },
    "gemma-7b": {
        "model_type": "gemma",
        "architectures": ["GemmaForCausalLM"],
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-06,
        "hidden_act": "gelu",
        "hidden_activation": None,
        "attention_bias": False,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    },
    "Ministral-8B-Instruct-2410": {
        "model_type": "ministral",
        "architectures": ["MinistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 131072,
        "max_position_embeddings": 32768,
        "rope_theta": 100000000.0,
        "rms_norm_eps": 1e-05,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "starcoder2-7b": {
        "model_type": "starcoder2",
        "architectures": ["Starcoder2ForCausalLM"],
        "hidden_size": 4608,
        "intermediate_size": 18432,
        "num_hidden_layers": 32,
        "num_attention_heads": 36,
        "num_key_value_heads": 4,
        "vocab_size": 49152,
        "max_position_embeddings": 16384,
        "rope_theta": 1000000,
        "norm_epsilon": 1e-05,
        "sliding_window": 4096,
        "use_bias": True,
        "hidden_act": "gelu_pytorch_tanh",
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "starcoderbase": {
        "model_type": "gpt_bigcode",
        "architectures": ["GPTBigCodeForCausalLM"],
        "n_embd": 6144,
        "n_layer": 40,
        "n_head": 48,
        "n_inner": 24576,
        "n_positions": 8192,
        "vocab_size": 49152,
        "multi_query": True,
        "activation_function": "gelu_pytorch_tanh",
        "layer_norm_epsilon": 1e-05,
        "scale_attn_weights": True,
        "attention_softmax_in_fp32": True,
        "scale_attention_softmax_in_fp32": True,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "EXAONE-3.5-7.8B-Instruct": {
        "model_type": "exaone",
        "architectures": ["ExaoneForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 102400,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "layer_norm_epsilon": 1e-05,
        "activation_function": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 361,
        "pad_token_id": 0,
    },
    "GLM-4.5-Air": {
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "pad_token_id": 151329,
        "eos_token_id": [151329, 151336, 151338],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "partial_rotary_factor": 0.5,
        "initializer_range": 0.02,
        "intermediate_size": 10944,
        "max_position_embeddings": 131072,
        "moe_intermediate_size": 1408,
        "norm_topk_prob": True,
        "num_attention_heads": 96,
        "n_group": 1,
        "topk_group": 1,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.0,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "num_hidden_layers": 46,
        "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0",
        "use_cache": True,
        "use_qk_norm": False,
        "vocab_size": 151552,
    },
    "GLM-4.5": {
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "pad_token_id": 151329,
        "eos_token_id": [151329, 151336, 151338],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "partial_rotary_factor": 0.5,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "max_position_embeddings": 131072,
        "moe_intermediate_size": 1536,
        "norm_topk_prob": True,
        "num_attention_heads": 96,
        "n_group": 1,
        "topk_group": 1,
        "n_routed_experts": 160,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "num_hidden_layers": 92,
        "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0",
        "use_cache": True,
        "use_qk_norm": True,
        "vocab_size": 151552,
    },
    "MiniMax-M2": {
        "model_type": "minimax_m2",
        "architectures": ["MiniMaxM2ForCausalLM"],
        "attention_dropout": 0.0,
        "attn_type_list": [1] * 62,
        "bos_token_id": None,
        "eos_token_id": None,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "initializer_range": 0.02,
        "intermediate_size": 1536,
        "layernorm_full_attention_beta": 1.0,
        "layernorm_linear_attention_beta": 1.0,
        "layernorm_mlp_beta": 1.0,
        "max_model_len": None,
        "max_position_embeddings": 196608,
        "mlp_intermediate_size": 8192,
        "mtp_transformer_layers": 1,
        "num_attention_heads": 48,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 62,
        "num_key_value_heads": 8,
        "num_local_experts": 256,
        "num_mtp_modules": 3,
        "output_router_logits": False,
        "qk_norm_type": "per_layer",
        "rms_norm_eps": 1e-06,
        "rope_theta": 5000000,
        "rotary_dim": 64,
        "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0,
        "scoring_func": "sigmoid",
        "shared_intermediate_size": 0,
        "shared_moe_mode": "sigmoid",
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_mtp": True,
        "use_qk_norm": True,
        "use_routing_bias": True,
        "vocab_size": 200064,
    },
    "GLM-4-9B-0414": {
        "model_type": "glm4",
        "architectures": ["Glm4ForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": [151329, 151336, 151338],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 13696,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "pad_token_id": 151329,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": 151552,
    },
    "glm-4-9b-chat-hf": {
        "model_type": "glm",
        "architectures": ["GlmForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": [151329, 151336, 151338],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 13696,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "pad_token_id": 151329,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1.5625e-07,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": 151552,
    },
    "stablelm-2-1_6b": {
        "model_type": "stablelm",
        "architectures": ["StableLmForCausalLM"],
        "bos_token_id": 100257,
        "eos_token_id": 100257,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "intermediate_size": 5632,
        "max_position_embeddings": 4096,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_hidden_layers": 24,
        "num_key_value_heads": 32,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000,
        "layer_norm_eps": 1e-05,
        "use_qkv_bias": True,
        "qk_layernorm": False,
        "use_parallel_residual": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "vocab_size": 100352,
    },
    "stablelm-3b-4e1t": {
        "model_type": "stablelm",
        "architectures": ["StableLmForCausalLM"],
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "intermediate_size": 6912,
        "max_position_embeddings": 4096,
        "hidden_size": 2560,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000,
        "layer_norm_eps": 1e-05,
        "use_qkv_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": 50304,
    },
}
"""From memory of the hub files (offline): the counts asserted are transformers' own model built from the same
values, so a misremembered value changes which model is checked, not whether the check can fail."""


@pytest.mark.slow
@pytest.mark.parametrize("name", PUBLISHED)
def test_published_configs_equal_transformers(name, meta_masks):
    values = {**PUBLISHED[name], **NO_IDS}
    model_type = values.pop("model_type")
    check_parameters(model_type, values)
    check_flops(model_type, values, 1024)


# -- refusals: every causal-LM type transformers registers is read or refused with a named reason --------------
def test_every_causal_lm_type_is_read_or_refused_with_a_reason():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES
    from lm_accounting.hf_fields import SAME_CLASSES, WRAPPERS
    from lm_accounting.hf_refusals import REFUSED_MODEL_TYPES, REFUSED_WRAPPERS

    read = set(SUPPORTED_MODEL_TYPES) | set(WRAPPERS) | set(SAME_CLASSES)
    refused = set(REFUSED_MODEL_TYPES) | set(REFUSED_WRAPPERS)
    assert not read & refused
    assert set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) <= read | refused, set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - read
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        if model_type in read:
            continue
        with pytest.raises(ConfigError) as err:
            config_from_hf({"model_type": model_type, **SMALL}, "cfg.json")
        text = str(err.value)
        reason = REFUSED_MODEL_TYPES.get(model_type) or REFUSED_MODEL_TYPES[REFUSED_WRAPPERS[model_type]]
        assert "\n" not in text and f"model_type '{model_type}'" in text and text.endswith(reason)


@pytest.mark.parametrize(
    ("model_type", "words"),
    [
        ("zamba2", "Zamba's shared attention blocks"),
        ("kimi_linear", "linear-attention layers not compared with Qwen3-Next's Gated DeltaNet"),
        ("lfm3", "short-convolution layers"),
        ("granite_swa", "attention sinks applied as a post-attention logsumexp scaling"),
        ("codegen", "attention and MLP in parallel"),
        ("persimmon", "squared ReLU"),
        ("laguna", "Laguna's softplus output gate"),
        ("arcee", "squared ReLU"),
        ("bart", "encoder-decoder"),
    ],
)
def test_a_refused_type_names_what_it_lacks(model_type, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        config_from_hf({"model_type": model_type, **SMALL})


@pytest.mark.parametrize("wrapper", ["qwen3_vl", "qwen3_vl_moe"])
def test_a_refused_wrapper_names_its_text_model(wrapper, run_cli, tmp_path):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": wrapper, "text_config": {"model_type": f"{wrapper}_text"}}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert f"multimodal wrapper whose text model '{wrapper}_text' has" in r.err


def test_every_unknown_field_is_listed_in_one_line():
    """GPTBigCode has learned positions: the RoPE fields its class inherits are not understood, all named."""
    values = {"model_type": "gpt_bigcode", **ZOO["gpt_bigcode"], "rope_theta": 5.0, "per_layer_config": {"0": {}}}
    with pytest.raises(ConfigError) as err:
        config_from_hf(values, "cfg.json")
    text = str(err.value)
    assert "\n" not in text
    assert "fields 'rope_theta', 'per_layer_config' are not understood for model_type 'gpt_bigcode'" in text


def test_helium_with_a_head_size_that_cannot_run_is_refused():
    with pytest.raises(ConfigError, match="Helium's o_proj is hidden_size wide"):
        config_from_hf({"model_type": "helium", **SMALL, "head_dim": 24})


# -- the commands: account, and memory under the default --impl transformers (model states) and --impl course --
def test_every_read_type_names_transformers_class():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES
    from lm_accounting.implementations import HF_CAUSAL_LM

    assert set(HF_CAUSAL_LM) == set(SUPPORTED_MODEL_TYPES)
    assert all(HF_CAUSAL_LM[t] == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t] for t in HF_CAUSAL_LM)


@pytest.mark.parametrize("name", ["SmolLM3-3B", "OLMoE-1B-7B-0924", "starcoderbase"])
def test_a_zoo_config_json_runs_account_and_memory(name, run_cli, tmp_path):
    """SmolLM3, StarCoder (gpt_bigcode) and OLMoE have programs (``ops.transformers.PROGRAMS``): their steps are
    predicted."""
    import json

    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(PUBLISHED[name]))
    total = parameter_breakdown(config_from_hf(PUBLISHED[name])).total
    r = run_cli("account", path, "--format", "json", "--context", 1024)
    assert r.code == 0 and json.loads(r.out)["parameters"]["total"] == total, r.err
    r = run_cli("memory", path, "--context", 1024)
    assert r.code == 0, r.err
    classes = {
        "SmolLM3-3B": "SmolLM3ForCausalLM",
        "starcoderbase": "GPTBigCodeForCausalLM",
        "OLMoE-1B-7B-0924": "OlmoeForCausalLM",
    }
    assert f"{classes[name]}, training mode" in r.out and "model states only" not in r.out
    r = run_cli("memory", path, "--context", 1024, "--impl", "course")
    assert r.code == 0 and "--impl course: our TransformerLM" in r.out, r.err


# -- multimodal wrappers whose text_config is any supported type: Mistral 3, Kimi K2.5 ----------------------------
WRAPPED = {
    "zoo-mistral3": {
        "model_type": "mistral3",
        "text_config": {"model_type": "mistral", **SMALL, "head_dim": 16, "sliding_window": None},
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 16,
        },
        "image_token_index": 10,
        "spatial_merge_size": 2,
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
    },
    "zoo-mistral3-ministral3-tied": {
        "model_type": "mistral3",
        "text_config": {"model_type": "ministral3", **SMALL, "head_dim": 16, "tie_word_embeddings": False},
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 16,
        },
    },
    "zoo-kimi_k25": {
        "model_type": "kimi_k25",
        "text_config": {
            **ZOO["glm4_moe_lite"],
            "model_type": "deepseek_v3",
            "mlp_layer_types": None,
            "first_k_dense_replace": 1,
            "n_shared_experts": 1,
        },
        "tie_word_embeddings": False,
    },
}
"""Small wrappers (transformers builds the vision tower too; only the text model is ours to count)."""


def text_parameters(model) -> int:
    """A wrapper model's text decoder and LM head: every parameter outside the vision tower and projector."""
    skip = ("vision_tower", "multi_modal_projector", "vision_model", "mm_projector", "projector", "visual")
    return sum(p.numel() for n, p in model.named_parameters() if not any(f".{s}." in f".{n}" for s in skip))


@pytest.mark.parametrize("name", WRAPPED)
def test_a_wrapper_is_counted_as_its_text_model(name):
    values = dict(WRAPPED[name])
    cfg = config_from_hf(values, name=name)
    assert cfg.name.endswith(f"(text model of a {values['model_type']} wrapper; the vision tower is not counted)")
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager")
    assert parameter_breakdown(cfg).total == text_parameters(model)
    assert cfg.tie_embeddings == config.tie_word_embeddings  # the wrapper's flag, not the text_config's


def test_docs_list_every_type_and_reason():
    from pathlib import Path

    from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES
    from lm_accounting.hf_fields import WRAPPERS
    from lm_accounting.hf_refusals import REASONS, REFUSED_WRAPPERS

    text = (Path(__file__).resolve().parent.parent / "docs" / "model_types.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")}
    assert set(SUPPORTED_MODEL_TYPES) <= rows
    assert all(f"`{w}`" in text for w in (*WRAPPERS, *REFUSED_WRAPPERS))
    for reason, types in REASONS.values():
        assert f"| {reason} | {', '.join(f'`{t}`' for t in types)} |" in text


SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
SHAPE_FIELDS += ("max_position_embeddings", "num_experts", "num_local_experts", "head_dim")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ZOO)
def test_full_size_at_the_class_defaults_equals_transformers(model_type, meta_masks):
    """Each class's defaults describe a full-size model (often the family's flagship: Hunyuan v3's 80 layers of
    192 experts, GLM-4.7-Flash, Helium 2B, InternLM3 8B): the shape fields the reader requires are given with the
    class's values, the rest left to the defaults on both sides."""
    cls = transformers.CONFIG_MAPPING[model_type]
    defaults = cls()
    values = {k: getattr(defaults, k) for k in SHAPE_FIELDS if getattr(defaults, k, None) is not None}
    values = {k: v for k, v in values.items() if k in DEFINED_FIELDS[model_type]} | NO_IDS
    if model_type in ("ministral", "hunyuan_v1_dense", "hunyuan_v1_moe"):  # their classes' head_dim None does not build
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if model_type == "gpt_bigcode":
        values = {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, **NO_IDS}
    check_parameters(model_type, values)
    check_flops(model_type, values, 1024)


@pytest.mark.parametrize("model_type", ["ministral", "hunyuan_v1_dense"])
def test_a_head_size_transformers_cannot_build_is_refused(model_type):
    """``getattr(config, "head_dim", ...)`` is the class's None: transformers' own build fails, so do we."""
    values = {"model_type": model_type, **SMALL}
    with pytest.raises(ConfigError, match=f"field 'head_dim' is required for {model_type}"):
        config_from_hf(values)
    with pytest.raises(TypeError):
        build_hf(values)


def test_exaone4_hub_pattern_is_read_beside_layer_types():
    """EXAONE-4.0's hub file writes ``sliding_window_pattern: "LLLG"`` with ``layer_types``; transformers' own
    ``__post_init__`` takes the string only when ``layer_types`` is given (``(i + 1) % "LLLG"`` fails)."""
    types = ["sliding_attention"] * 3 + ["full_attention"]
    values = {**SMALL, "sliding_window": WINDOW, "sliding_window_pattern": "LLLG", "layer_types": types}
    cfg = config_from_hf({"model_type": "exaone4", **values})
    assert (cfg.sliding_window, cfg.full_attention_every, cfg.windowed_layers) == (WINDOW, 4, 3)
    check_parameters("exaone4", values)
    without = {k: v for k, v in values.items() if k != "layer_types"}
    with pytest.raises(ConfigError, match="'sliding_window_pattern' = 'LLLG' is read only as 'L...LG' beside"):
        config_from_hf({"model_type": "exaone4", **without})
    with pytest.raises(TypeError):
        build_hf({"model_type": "exaone4", **without})


@pytest.mark.parametrize(
    ("model_type", "change", "message"),
    [
        ("granite", {"embedding_multiplier": "12"}, "field 'embedding_multiplier'"),
        ("hunyuan_v1_moe", {"moe_topk": [2, 1, 2, 2]}, "field 'moe_topk' differs between layers"),
        ("granitemoeshared", {"shared_intermediate_size": -1}, "field 'shared_intermediate_size' must be"),
        ("olmoe", {"clip_qkv": 8.0}, "field 'clip_qkv' = 8.0 is not supported"),
        ("gpt_bigcode", {"multi_query": "yes"}, "field 'multi_query' must be true or false"),
        ("internlm3", {"bias": False}, "fields 'qkv_bias' and 'bias' must agree"),
        ("phimoe", {"lm_head_bias": True}, "field 'lm_head_bias' = True is not supported"),
    ],
)
def test_bad_zoo_fields_are_one_line_exit_2(model_type, change, message, run_cli, tmp_path):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **ZOO[model_type], **change}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_a_zoo_type_without_a_writer_is_one_line(monkeypatch):
    """A read type with no writer (PhiMoE's ``WRITERS`` entry removed) is refused in one line."""
    from lm_accounting.hf_config import WRITERS, to_hf_dict

    monkeypatch.delitem(WRITERS, "phimoe")
    with pytest.raises(ConfigError, match="hf_model_type 'phimoe' is not one lm-accounting writes back"):
        to_hf_dict(config_from_hf({"model_type": "phimoe", **ZOO["phimoe"]}))


def test_gpt_sw3_is_read_as_gpt2():
    """GPT-SW3's configuration and causal-LM classes are GPT-2's (``hf_fields.SAME_CLASSES``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lm_accounting.hf_fields import SAME_CLASSES

    for alias, target in SAME_CLASSES.items():
        assert CONFIG_MAPPING_NAMES[alias] == CONFIG_MAPPING_NAMES[target]
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[alias] == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[target]
    values = {"vocab_size": 256, "n_embd": 64, "n_layer": 4, "n_head": 4, "n_positions": 512, **NO_IDS}
    cfg = config_from_hf({"model_type": "gpt-sw3", **values})
    assert cfg.hf_model_type == "gpt2" and cfg == config_from_hf({"model_type": "gpt2", **values})
    model = build_hf({"model_type": "gpt-sw3", **values})
    assert parameter_breakdown(cfg).total == sum(p.numel() for p in model.parameters())


def test_sarvam_legacy_head_dims_are_dropped_as_transformers_drops_them():
    values = {**ZOO["sarvam_mla"], "head_dim": 32 + 8, "q_head_dim": 24}  # kv_lora_rank + qk_rope_head_dim
    cfg = config_from_hf({"model_type": "sarvam_mla", **values})
    assert {"head_dim", "q_head_dim"} <= set(cfg.ignored_fields)
    assert cfg == config_from_hf({"model_type": "sarvam_mla", **ZOO["sarvam_mla"]})
    check_parameters("sarvam_mla", values)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model_type": "mistral3"}, "its text model ('text_config') is missing"),
        ({"model_type": "kimi_k25", "text_config": "deepseek_v3"}, "its text model ('text_config') is not an object"),
        (
            {"model_type": "mistral3", "text_config": {"model_type": "codegen"}},
            "multimodal wrapper whose text model 'codegen' has attention and MLP in parallel",
        ),
        ({"model_type": "mistral3", "text_config": {"model_type": "nope"}}, "must be a supported model_type"),
        ({"model_type": "gemma3", "text_config": {"model_type": "llama"}}, "must be 'gemma3_text', got 'llama'"),
    ],
)
def test_a_bad_wrapper_is_one_line_exit_2(data, message, run_cli, tmp_path):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    for command in ("account", "memory"):
        r = run_cli(command, path)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


@pytest.mark.slow
def test_reading_zoo_configs_imports_no_torch(tmp_path):
    """Every published zoo config.json and wrapper, read in a fresh process: no torch, no transformers."""
    import json
    import subprocess
    import sys

    paths = []
    for name, values in {**PUBLISHED, **WRAPPED}.items():
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(values))
        paths.append(str(path))
    code = (
        "import sys\n"
        "from lm_accounting import load_config, account\n"
        f"totals = [account(load_config(p), seq=1024).params.total for p in {paths!r}]\n"
        "print(len(totals), 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    assert run.stdout.split() == [str(len(paths)), "False", "False"]
