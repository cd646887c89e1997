"""Ground truth from transformers: the same config.json, built as transformers' own model on meta.

For every new preset and every supported ``model_type``, the config.json values (written out below from
the published Hugging Face files; this machine is offline) go two ways:

* ``hf_config.config_from_hf`` -> our ``ModelConfig`` -> the analytic counts;
* ``AutoConfig.for_model`` -> ``AutoModelForCausalLM.from_config(..., attn_implementation="eager")`` on
  the meta device -> ``parameters()`` and ``FlopCounterMode`` over one forward of 1,024 and 4,096 tokens.

They must agree exactly: the parameter total and every component whose name maps (fused projections
map to the sum of ours: GPT-2's ``c_attn`` and Phi-3's ``qkv_proj`` = q + k + v, Phi-3's ``gate_up_proj`` =
w1 + w3), and the forward FLOPs in total and per component (the attention core = the attention module's
own FLOPs minus its projections = our QKᵀ + AV, full square; the LM head over every position).

Traps handled: transformers' packed-sequence mask helper calls ``.item()`` on a meta tensor, so it is
patched to return None (one unpacked sequence); CPU SDPA counts 0 FLOPs, so attention is eager.
transformers is a test-only dependency (the ``dev`` extra); lm_accounting never imports it.
"""

import re
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import load_config
from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES, config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GPT2 = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "n_ctx": 1024,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "vocab_size": 50257,
}
LLAMA_31 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

CONFIGS = {  # name -> (config.json values, published parameter count of the full model, exact or "46.7B")
    "openai-gpt2": ({**GPT2, "n_embd": 768, "n_layer": 12, "n_head": 12}, 124_439_808),
    "openai-gpt2-medium": ({**GPT2, "n_embd": 1024, "n_layer": 24, "n_head": 16}, 354_823_168),
    "openai-gpt2-large": ({**GPT2, "n_embd": 1280, "n_layer": 36, "n_head": 20}, 774_030_080),
    "openai-gpt2-xl": ({**GPT2, "n_embd": 1600, "n_layer": 48, "n_head": 25}, 1_557_611_200),
    "llama-3.1-8b": (
        {
            **LLAMA_31,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
        },
        8_030_261_248,
    ),
    "llama-3.1-70b": (
        {
            **LLAMA_31,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
        },
        70_553_706_496,
    ),
    "llama-3.1-405b": (
        {
            **LLAMA_31,
            "hidden_size": 16384,
            "intermediate_size": 53248,
            "num_attention_heads": 128,
            "num_hidden_layers": 126,
        },
        405_853_388_800,
    ),
    "qwen3-8b": (
        {
            **QWEN3,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_attention_heads": 32,
            "num_hidden_layers": 36,
            "max_window_layers": 36,
        },
        8_190_735_360,
    ),
    "qwen3-32b": (
        {
            **QWEN3,
            "hidden_size": 5120,
            "intermediate_size": 25600,
            "num_attention_heads": 64,
            "num_hidden_layers": 64,
            "max_window_layers": 64,
        },
        32_762_123_264,
    ),
    "mistral-7b": (
        {
            "model_type": "mistral",
            "architectures": ["MistralForCausalLM"],
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 14336,
            "max_position_embeddings": 32768,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.34.0.dev0",
            "use_cache": True,
            "vocab_size": 32000,
        },
        7_241_732_096,
    ),
    "mixtral-8x7b": (
        {
            "model_type": "mixtral",
            "architectures": ["MixtralForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 14336,
            "max_position_embeddings": 32768,
            "num_attention_heads": 32,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "output_router_logits": False,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.02,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.36.0.dev0",
            "use_cache": True,
            "vocab_size": 32000,
        },
        "46.7B",  # the model card's safetensors total (Jiang et al. 2024: "47B")
    ),
    "deepseek-v3": (
        {
            "model_type": "deepseek_v3",
            "architectures": ["DeepseekV3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "ep_size": 1,
            "first_k_dense_replace": 3,
            "hidden_act": "silu",
            "hidden_size": 7168,
            "initializer_range": 0.02,
            "intermediate_size": 18432,
            "kv_lora_rank": 512,
            "max_position_embeddings": 163840,
            "moe_intermediate_size": 2048,
            "moe_layer_freq": 1,
            "n_group": 8,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "norm_topk_prob": True,
            "num_attention_heads": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 61,
            "num_key_value_heads": 128,
            "num_nextn_predict_layers": 1,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {
                "beta_fast": 32,
                "beta_slow": 1,
                "factor": 40,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
                "type": "yarn",
            },
            "rope_theta": 10000,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "tie_word_embeddings": False,
            "topk_group": 4,
            "topk_method": "noaux_tc",
            "torch_dtype": "bfloat16",
            "transformers_version": "4.33.1",
            "use_cache": True,
            "v_head_dim": 128,
            "vocab_size": 129280,
        },
        # DeepSeek-AI 2024 (arXiv:2412.19437): 671B; the model card's 685B adds the 14B multi-token-prediction
        # module, which transformers does not build (nor do we)
        "671B",
    ),
    # model types without a preset: the published config of one released model each
    "qwen3-30b-a3b": (
        {
            "model_type": "qwen3_moe",
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "decoder_sparse_step": 1,
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 6144,
            "max_position_embeddings": 40960,
            "max_window_layers": 48,
            "mlp_only_layers": [],
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "num_attention_heads": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
        "30.5B",  # "30.5B in total and 3.3B activated" (Qwen3 model card)
    ),
    "deepseek-v2-lite": (
        {
            "model_type": "deepseek_v2",
            "architectures": ["DeepseekV2ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "aux_loss_alpha": 0.001,
            "bos_token_id": 100000,
            "eos_token_id": 100001,
            "first_k_dense_replace": 1,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 10944,
            "kv_lora_rank": 512,
            "max_position_embeddings": 163840,
            "moe_intermediate_size": 1408,
            "moe_layer_freq": 1,
            "n_group": 1,
            "n_routed_experts": 64,
            "n_shared_experts": 2,
            "norm_topk_prob": False,
            "num_attention_heads": 16,
            "num_experts_per_tok": 6,
            "num_hidden_layers": 27,
            "num_key_value_heads": 16,
            "q_lora_rank": None,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000,
            "routed_scaling_factor": 1.0,
            "scoring_func": "softmax",
            "seq_aux": True,
            "tie_word_embeddings": False,
            "topk_group": 1,
            "topk_method": "greedy",
            "torch_dtype": "bfloat16",
            "transformers_version": "4.33.1",
            "use_cache": True,
            "v_head_dim": 128,
            "vocab_size": 102400,
        },
        "15.7B",  # "15.7B total parameters, 2.4B activated" (DeepSeek-V2-Lite model card)
    ),
    "qwen2.5-0.5b": (
        {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151643,
            "hidden_act": "silu",
            "hidden_size": 896,
            "initializer_range": 0.02,
            "intermediate_size": 4864,
            "max_position_embeddings": 32768,
            "max_window_layers": 24,
            "num_attention_heads": 14,
            "num_hidden_layers": 24,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.40.1",
            "use_cache": True,
            "use_mrope": False,
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
        494_032_768,
    ),
    "gemma-2-2b": (
        {
            "model_type": "gemma2",
            "architectures": ["Gemma2ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": 50.0,
            "bos_token_id": 2,
            "cache_implementation": "hybrid",
            "eos_token_id": 1,
            "final_logit_softcapping": 30.0,
            "head_dim": 256,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 2304,
            "initializer_range": 0.02,
            "intermediate_size": 9216,
            "max_position_embeddings": 8192,
            "num_attention_heads": 8,
            "num_hidden_layers": 26,
            "num_key_value_heads": 4,
            "pad_token_id": 0,
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "torch_dtype": "float32",
            "transformers_version": "4.42.4",
            "use_cache": True,
            "vocab_size": 256000,
        },
        2_614_341_888,
    ),
    "gemma-3-1b": (
        {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": None,
            "bos_token_id": 2,
            "cache_implementation": "hybrid",
            "eos_token_id": 1,
            "final_logit_softcapping": None,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 1152,
            "initializer_range": 0.02,
            "intermediate_size": 6912,
            "max_position_embeddings": 32768,
            "num_attention_heads": 4,
            "num_hidden_layers": 26,
            "num_key_value_heads": 1,
            "pad_token_id": 0,
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.50.0.dev0",
            "use_cache": True,
            "vocab_size": 262144,
        },
        999_885_952,
    ),
    "phi-3-mini-4k": (
        {
            "model_type": "phi3",
            "architectures": ["Phi3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "embd_pdrop": 0.0,
            "eos_token_id": 32000,
            "hidden_act": "silu",
            "hidden_size": 3072,
            "initializer_range": 0.02,
            "intermediate_size": 8192,
            "max_position_embeddings": 4096,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "original_max_position_embeddings": 4096,
            "pad_token_id": 32000,
            "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 10000.0,
            "sliding_window": 2047,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.40.2",
            "use_cache": True,
            "vocab_size": 32064,
        },
        3_821_079_552,
    ),
    "olmo-2-7b": (
        {
            "model_type": "olmo2",
            "architectures": ["Olmo2ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "eos_token_id": 100257,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 11008,
            "max_position_embeddings": 4096,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "pad_token_id": 100277,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 500000,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.47.0.dev0",
            "use_cache": True,
            "vocab_size": 100352,
        },
        7_298_617_344,
    ),
}
OTHER = {"deepseek-v2-lite"}  # no preset
REDUCED = {"llama-3.1-70b", "llama-3.1-405b"}  # built with num_hidden_layers = 2 (meta builds stay fast)


def test_every_supported_model_type_is_covered():
    """Here, or (the architectures with pieces of their own) in tests/test_gpt_oss.py and tests/test_arch_*.py."""
    from test_arch_bloom import CONFIGS as BLOOM
    from test_arch_ernie4_5_moe import CONFIGS as ERNIE
    from test_arch_olmo import CONFIGS as OLMO
    from test_arch_qwen2_moe import CONFIGS as QWEN2_MOE
    from test_gpt_oss import CONFIGS as GPT_OSS

    covered = {c["model_type"] for c, _ in [*CONFIGS.values(), *GPT_OSS.values(), *BLOOM.values()]}
    covered |= {c["model_type"] for c in [*QWEN2_MOE.values(), *OLMO.values(), *ERNIE.values()]}
    assert covered == set(SUPPORTED_MODEL_TYPES)


def hf_values(name: str) -> dict:
    values = dict(CONFIGS[name][0])
    if name in REDUCED:
        values["num_hidden_layers"] = 2
    return values


def build_hf(values: dict):
    values = dict(values)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    # experts: batched_mm counts the selected experts' matmuls (the default grouped_mm counts 0 FLOPs)
    moe = {"experts_implementation": "batched_mm"} if hasattr(config, "num_experts_per_tok") else {}
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", **moe)


# -- name maps: transformers' module path -> our component keys (a fused module maps to several) ----------
QKV, GATE_UP = ("attn.q_proj", "attn.k_proj", "attn.v_proj"), ("ffn.w1", "ffn.w3")
LLAMA_MODULES = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "self_attn.qkv_proj": QKV,
    "self_attn.q_norm": ("attn.q_norm",),
    "self_attn.k_norm": ("attn.k_norm",),
    "mlp.gate_proj": ("ffn.w1",),
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
    "mlp.gate_up_proj": GATE_UP,
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "pre_feedforward_layernorm": ("ln2",),
    "post_feedforward_layernorm": ("post_ffn_norm",),
    # mixture of experts (transformers v5: experts stacked in two 3-D parameters, named by parameter)
    "mlp.gate": ("moe.router",),
    "mlp.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),  # FLOPs: one module
    "mlp.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),  # parameters: by name
    "mlp.experts.down_proj": ("moe.experts.w2",),
    "mlp.shared_experts.gate_proj": ("moe.shared.w1",),
    "mlp.shared_experts.up_proj": ("moe.shared.w3",),
    "mlp.shared_experts.down_proj": ("moe.shared.w2",),
    # multi-head latent attention
    "self_attn.q_a_proj": ("attn.q_a_proj",),
    "self_attn.q_a_layernorm": ("attn.q_a_norm",),
    "self_attn.q_b_proj": ("attn.q_b_proj",),
    "self_attn.kv_a_proj_with_mqa": ("attn.kv_a_proj",),
    "self_attn.kv_a_layernorm": ("attn.kv_a_norm",),
    "self_attn.kv_b_proj": ("attn.kv_b_proj",),
}
GEMMA_OLMO_NORMS = {"post_attention_layernorm": ("post_attn_norm",)}  # after attention there, not before the FFN
GPT2_MODULES = {
    "attn.c_attn": QKV,
    "attn.c_proj": ("attn.output_proj",),
    "mlp.c_fc": ("ffn.fc",),
    "mlp.c_proj": ("ffn.proj",),
    "ln_1": ("ln1",),
    "ln_2": ("ln2",),
}
TOP = {
    "model.embed_tokens": "token_embeddings",
    "transformer.wte": "token_embeddings",
    "transformer.wpe": "position_embeddings",
    "model.norm": "ln_final",
    "transformer.ln_f": "ln_final",
    "lm_head": "lm_head",
}
LAYER = re.compile(r"^(?:model\.layers|transformer\.h)\.\d+\.(.+)$")


def our_keys(model_type: str, module: str, suffix: str = "") -> tuple[str, ...]:
    """Our component keys for transformers' module path (``suffix`` ".bias" for a projection's bias)."""
    if module in TOP:
        return (TOP[module],)
    match = LAYER.match(module)
    assert match, module
    table = (
        GPT2_MODULES
        if model_type == "gpt2"
        else {**LLAMA_MODULES, **(GEMMA_OLMO_NORMS if model_type in ("gemma2", "gemma3_text", "olmo2") else {})}
    )
    inner = table[match.group(1)]
    bias = suffix if not inner[0].startswith(("ln", "post_")) else ""  # a norm's bias is part of the norm
    return tuple(f"layers.*.{k}{bias}" for k in inner)


def hf_parameters_by_component(model, model_type: str) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = defaultdict(int)
    for name, param in model.named_parameters():  # a tied weight is listed once
        module, _, kind = name.rpartition(".")
        if kind not in ("weight", "bias"):  # stacked experts: named by parameter
            module, kind = name, "weight"
        out[our_keys(model_type, module, ".bias" if kind == "bias" else "")] += param.numel()
    return dict(out)


# -- parameters ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name):
    values, published = CONFIGS[name]
    ours = config_from_hf(values, name=name)
    total = parameter_breakdown(ours).total  # the full model, analytic
    if isinstance(published, str):  # published to the digits shown ("46.7B")
        digits = len(published.rstrip("B").partition(".")[2])
        assert f"{total / 1e9:.{digits}f}B" == published
    else:
        assert total == published
    values = hf_values(name)
    cfg = config_from_hf(values, name=name)
    model = build_hf(values)
    hf_total = sum(p.numel() for p in model.parameters())
    bd = parameter_breakdown(cfg)
    assert bd.total == hf_total
    L = cfg.num_layers
    for keys, count in hf_parameters_by_component(model, values["model_type"]).items():
        analytic = sum(bd[k].total for k in keys)
        assert analytic == count, (keys, analytic, count)
    assert "lm_head" in bd.totals() and (bd["lm_head"].total == 0) == cfg.tie_embeddings
    if name in REDUCED:  # the full model = 2 layers + (L - 2) more of the same
        full = config_from_hf(CONFIGS[name][0])
        per_layer = bd.per_layer_total
        assert parameter_breakdown(full).total == bd.total + (full.num_layers - L) * per_layer


def test_presets_are_their_config_json():
    """Each new preset TOML says the same as its config.json (every field but the name and the ignored list)."""
    for name, (values, _) in CONFIGS.items():
        if name in ("qwen2.5-0.5b", "gemma-2-2b", "gemma-3-1b", "phi-3-mini-4k", "olmo-2-7b") or name in OTHER:
            continue
        from_json = config_from_hf(values, name=name).resolved()
        preset = load_config(name).resolved()
        assert {**from_json, "ignored_fields": []} == preset, name


# -- forward FLOPs ------------------------------------------------------------------------------------
@pytest.fixture
def meta_masks(monkeypatch):
    """transformers' packed-sequence detection calls .item() on a meta tensor: one unpacked sequence here."""
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda *args, **kwargs: None)


def hf_forward_flops(model, seq: int) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    tokens = torch.zeros(1, seq, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False, depth=None) as counter, torch.no_grad():
        model(input_ids=tokens, use_cache=False)
    root = type(model).__name__ + "."
    flops = {k.removeprefix(root): int(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    flops["total"] = int(counter.get_total_flops())
    return flops


def compare_flops(name: str, seq: int) -> None:
    values = hf_values(name)
    cfg = (
        config_from_hf(values, name=name).with_context(seq)
        if seq <= values.get("max_position_embeddings", values.get("n_positions", seq))
        else None
    )
    assert cfg is not None
    model = build_hf(values)
    counted = hf_forward_flops(model, seq)
    fwd = forward_flops(cfg, seq)
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    model_type = values["model_type"]
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    attention_core = 0
    for module, flops in counted.items():
        if module in TOP:
            by_keys[our_keys(model_type, module)] += flops
            continue
        match = LAYER.match(module)
        if not match:
            continue
        inner = match.group(1)
        if inner in ("self_attn", "attn"):  # eager attention: QKᵀ and AV run in the module itself
            children = sum(
                v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == module.count(".") + 1
            )
            attention_core += flops - children
        elif (
            "." in inner
            and not inner.endswith(("_norm", "layernorm"))
            and inner.split(".")[0] in ("self_attn", "attn", "mlp")
            and not any(k.startswith(module + ".") for k in counted)  # a leaf (not mlp.shared_experts)
        ):
            by_keys[our_keys(model_type, module)] += flops
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - {"layers.*.attn.qk", "layers.*.attn.av"}
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert attention_core == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total
    assert fwd["layers.*.attn.qk"].total == cfg.num_layers * 2 * cfg.num_heads * seq * seq * cfg.d_head


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 4096])
def test_forward_flops_equal_transformers(name, seq, meta_masks):
    """Each case takes 0.1-1.2 s on meta (2 cores), so none is marked slow."""
    if name.startswith("openai-gpt2") and seq > 1024:
        pytest.skip("GPT-2 has 1,024 learned positions")
    compare_flops(name, seq)


def test_gpt2_beyond_its_positions_is_refused_both_ways(meta_masks):
    from lm_accounting.config import ConfigError

    with pytest.raises(ConfigError, match="exceeds the 1,024 learned positions"):
        config_from_hf(hf_values("openai-gpt2")).with_context(4096)


def test_reading_a_config_imports_no_torch(tmp_path):
    """The analytic answer for a config.json, in a fresh process: no torch, no transformers (the time it
    takes is measured in benchmarks/, not asserted)."""
    import json
    import subprocess
    import sys

    path = tmp_path / "Llama-3.1-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS["llama-3.1-8b"][0]))
    code = (
        "import sys\n"
        "from lm_accounting import load_config, account\n"
        f"a = account(load_config({str(path)!r}), seq=8192)\n"
        "print(a.params.total, a.config.name, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    assert run.stdout.split() == ["8030261248", "Llama-3.1-8B", "False", "False"]
