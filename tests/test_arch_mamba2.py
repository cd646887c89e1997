"""Mamba2 hybrids (Nemotron-H, Bamba, Granite-4.0-H, Falcon-H1): parameters, forward FLOPs and the inference cache,
exact against transformers 5.24.

transformers' models/nemotron_h/modeling_nemotron_h.py: one ``NemotronHBlock`` per letter of the layer pattern
(``hybrid_override_pattern``, or ``layers_block_type``), ``x + mixer(norm(x))``: ``M`` a ``NemotronHMamba2Mixer``
(``in_proj`` to z, x, B, C and dt; a depthwise causal conv1d with a bias over x, B, C; ``dt_bias``, ``A_log``, ``D``;
the chunked SSD scan ``mamba2_chunk_scan``; a gated RMSNorm per group; ``out_proj``), ``*`` a ``NemotronHAttention``
(GQA, no bias, no rotary embedding), ``-`` a ``NemotronHMLP`` (``up_proj``, squared ReLU, ``down_proj``), ``E`` a
``NemotronHMoE`` (a router, experts without gate, optional latent projections, a shared ``NemotronHMLP``).
models/bamba (``BambaDecoderLayer``) and models/granitemoehybrid (``GraniteMoeHybridDecoderLayer``): Llama's block
whose mixer is the same Mamba2 (or attention) and whose FFN is a SwiGLU (Granite-4.0-H: its ``shared_mlp``, with
routed experts beside it when ``num_local_experts`` > 0); models/falcon_h1 (``FalconH1DecoderLayer``): attention and
the Mamba2 mixer side by side in every layer, then a SwiGLU.

Method: parameters by name on meta (``build_hf``) at full size; forward FLOPs with FlopCounterMode module by module on
meta at full size at 1,000 and 4,096 tokens (not a multiple of the 128- or 256-token chunk, and one), and on small
real CPU tensors at 64 and 100 tokens (chunks of 32: a multiple and not) with two sequences, routed experts as
``batched_mm``; the SSD scan alone against the closed form written out; a decode step, a cached prefill and the cache
against the ``DynamicCache`` transformers returns after a prefill, on CPU.

The full-size configs: nvidia/Nemotron-H-8B-Base-8K is ``NemotronHConfig``'s defaults (the class's docstring of the
transformers 4.x port names it: hidden 4,096, 32 heads of 128, 8 KV heads, MLP 21,504, Mamba2 128 heads × 64, 8
groups of state 128, vocabulary 131,072) with its 52-letter pattern as remembered; nvidia/NVIDIA-Nemotron-Nano-9B-v2's
and Nemotron-3-Nano-30B-A3B's fields are written as the hub files are remembered (the 9B's shape agrees with public
copies of it: the search excerpt's 56-letter pattern, sizes and heads); their ``time_step_limit`` (``[0.0,
Infinity]`` in the hub files, not strict JSON) is left out here.  Their names ("8B", "9B") and Nemotron 3 Nano's
card totals (as remembered) are checked against our totals.  Bamba's, Granite-4.0-H's and Falcon-H1's are their
classes' defaults (and a dense Granite-4.0-H of Micro's remembered shape), not checked checkpoints.
"""

import json
import re
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import (
    forward_flops,
    mamba_conv_flops,
    ssd_scan_flops,
    ssd_step_flops,
    training_flops,
)
from lm_accounting.analytic.inference import decode_flops, layer_slots, prefill_flops
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import (
    assert_parameters_equal,
    cpu_forward_flops,
    cpu_model,
    hybrid_cache_after_prefill,
    layer_keys,
)
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

NEMOTRON_H_8B = {  # NemotronHConfig's defaults (Nemotron-H-8B-Base-8K) with its pattern, written out
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 4096,
    "intermediate_size": 21504,
    "num_hidden_layers": 52,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "mlp_hidden_act": "relu2",
    "layer_norm_epsilon": 1e-05,
    "tie_word_embeddings": False,
}
NEMOTRON_NANO_9B_V2 = {  # nvidia/NVIDIA-Nemotron-Nano-9B-v2/config.json (see the module docstring)
    "architectures": ["NemotronHForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "chunk_size": 128,
    "conv_kernel": 4,
    "eos_token_id": 12,
    "head_dim": 128,
    "hidden_dropout": 0.0,
    "hidden_size": 4480,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "initializer_range": 0.02,
    "intermediate_size": 15680,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 80,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 128,
    "mamba_proj_bias": False,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h",
    "n_groups": 8,
    "num_attention_heads": 40,
    "num_hidden_layers": 56,
    "num_key_value_heads": 8,
    "num_logits_to_keep": 1,
    "pad_token_id": 0,
    "rescale_prenorm_residual": True,
    "residual_in_fp32": False,
    "sliding_window": None,
    "ssm_state_size": 128,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "use_mamba_kernels": True,
    "vocab_size": 131072,
}
BAMBA_DEFAULTS = {  # BambaConfig's defaults written out, with 3 attention layers of 32 (9, 18, 27): a full-size Bamba,
    # not a checked checkpoint (ibm-ai-platform/Bamba-9B's own config.json could not be read offline; these defaults
    # give about 9.8B parameters)
    "model_type": "bamba",
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 262144,
    "attn_layer_indices": [9, 18, 27],
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
}
GRANITE_H_DENSE = {  # a full-size dense Granite-4.0-H: GraniteMoeHybridConfig's defaults with no routed experts, NoPE
    # attention on 4 of 40 layers and a 4,096-wide shared MLP (the shape of Granite-4.0-H-Micro as remembered, not a
    # checked config.json)
    "model_type": "granitemoehybrid",
    "vocab_size": 100352,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "shared_intermediate_size": 8192,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "num_local_experts": 0,
    "layer_types": ["mamba"] * 9
    + ["attention"]
    + ["mamba"] * 9
    + ["attention"]
    + ["mamba"] * 9
    + ["attention"]
    + ["mamba"] * 9
    + ["attention"],
    "mamba_n_heads": 64,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "logits_scaling": 8.0,
    "position_embedding_type": "nope",
    "tie_word_embeddings": True,
}
FALCON_H1_DEFAULTS = {  # FalconH1Config's defaults written out (a 32-layer, 4,096-wide Falcon-H1; mamba_d_ssm
    # 1,024 of 128 heads of 8), with its multipliers set as muP does: no count changes
    "model_type": "falcon_h1",
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "mamba_d_ssm": 1024,
    "mamba_n_heads": 128,
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 256,
    "mamba_rms_norm": False,
    "lm_head_multiplier": 0.5,
    "embedding_multiplier": 2.0,
    "key_multiplier": 0.25,
    "mlp_multipliers": [0.5, 2.0],
    "ssm_multipliers": [0.5, 1.0, 2.0, 1.0, 0.5],
}
GRANITE_H_MOE_DEFAULTS = {  # GraniteMoeHybridConfig's defaults (8 routed experts of 11,008, top-2, a 1,024-wide shared
    # MLP, every layer Mamba2 but two attention layers), written out
    "model_type": "granitemoehybrid",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "shared_intermediate_size": 1024,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "layer_types": ["mamba"] * 15 + ["attention"] + ["mamba"] * 15 + ["attention"],
}
NEMOTRON_3_NANO = {  # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B (NemotronHConfig's docstring checkpoint), its sizes as
    # remembered offline: 52 layers (23 Mamba2, 23 MoE, 6 attention), 128 experts of 1,856, top-6, a 3,712-wide shared
    # expert; the model card's "31.6B total", "3.2B active (3.6B with the embeddings)" are checked below
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 2688,
    "intermediate_size": 1856,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "max_position_embeddings": 262144,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "n_routed_experts": 128,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
CONFIGS = {
    "nemotron-h-8b": NEMOTRON_H_8B,
    "nemotron-3-nano-30b-a3b": NEMOTRON_3_NANO,
    "nemotron-nano-9b-v2": NEMOTRON_NANO_9B_V2,
    "bamba-defaults": BAMBA_DEFAULTS,
    "granite-h-dense": GRANITE_H_DENSE,
    "granite-h-moe-defaults": GRANITE_H_MOE_DEFAULTS,
    "falcon-h1-defaults": FALCON_H1_DEFAULTS,
}

TINY = {  # small enough for real CPU tensors: chunks of 32, 2 groups of 4 heads
    "model_type": "nemotron_h",
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "hybrid_override_pattern": "M-M*-M",
    "mamba_num_heads": 8,
    "mamba_head_dim": 8,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 32,
}
TINY_CONFIGS = {
    "tiny-nemotron-h": TINY,
    "tiny-legacy-names": {  # the spellings NemotronHConfig.__post_init__ renames, and the list form of the pattern
        **{
            k: v
            for k, v in TINY.items()
            if k not in ("n_groups", "conv_kernel", "chunk_size", "hybrid_override_pattern")
        },
        "mamba_n_groups": 4,
        "mamba_d_conv": 3,
        "mamba_chunk_size": 16,
        "layers_block_type": ["mlp", "linear_attention", "full_attention", "linear_attention"],
    },
    "tiny-mlp-bias": {**TINY, "mlp_bias": True, "hybrid_override_pattern": "*-M-", "tie_word_embeddings": True},
    "tiny-bamba": {  # Bamba: every layer a mixer (attention on 1 and 3) and a SwiGLU; RoPE on half of each head
        "model_type": "bamba",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "attn_layer_indices": [1, 3],
        "mamba_n_heads": 8,
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "mamba_chunk_size": 32,
    },
    "tiny-granite-h": {  # Granite-4.0-H, dense: attention (RoPE, biases) on layer 2, the legacy layer-type names
        "model_type": "granitemoehybrid",
        "vocab_size": 97,
        "hidden_size": 64,
        "shared_intermediate_size": 80,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "num_local_experts": 0,
        "layer_types": ["mamba", "mamba", "attention", "mamba"],
        "position_embedding_type": "rope",
        "attention_bias": True,
        "mamba_n_heads": 8,
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "mamba_chunk_size": 32,
        "residual_multiplier": 0.5,
    },
    "tiny-nemotron-h-no-mamba": {**TINY, "hybrid_override_pattern": "*-*-"},  # the Mamba2 fields build nothing
    "tiny-nemotron-h-moe": {  # Nemotron 3's E layers: 8 experts of 20 (top-2 of 2 groups), a shared expert of 36
        **TINY,
        "hybrid_override_pattern": "ME*E-M",
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 20,
        "moe_shared_expert_intermediate_size": 36,
        "n_group": 2,
        "topk_group": 1,
    },
    "tiny-nemotron-h-latent": {  # the latent projections around the experts, with mlp_bias
        **TINY,
        "hybrid_override_pattern": "MEE*-",
        "n_routed_experts": 4,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 20,
        "moe_shared_expert_intermediate_size": 36,
        "moe_latent_size": 24,
        "mlp_bias": True,
    },
    "tiny-granite-h-moe": {  # Granite-4.0-H-Tiny's shape: 4 routed SwiGLU experts (top-2) and the shared MLP, NoPE
        "model_type": "granitemoehybrid",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 24,
        "shared_intermediate_size": 80,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        "mamba_n_heads": 8,
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "mamba_chunk_size": 32,
    },
    "tiny-falcon-h1": {  # Falcon-H1: attention and Mamba2 side by side in every layer, the gated norm, biases, tied
        "model_type": "falcon_h1",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "mamba_d_ssm": None,
        "mamba_expand": 1,
        "mamba_n_heads": 8,
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_chunk_size": 32,
        "mamba_rms_norm": True,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "attention_in_multiplier": 0.5,
        "ssm_out_multiplier": 2.0,
    },
    "tiny-bamba-biased": {  # attention and MLP biases, tied, 2 x 64 = 8 heads of 16
        "model_type": "bamba",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 512,
        "attn_layer_indices": [0],
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 4,
        "mamba_d_state": 8,
        "mamba_d_conv": 3,
        "mamba_expand": 2,
        "mamba_chunk_size": 16,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
}

MAMBA_NAMES = ("in_proj", "conv1d", "conv1d.bias", "dt_bias", "A_log", "D", "norm", "out_proj")
"""A Mamba2 mixer's modules and parameters: Nemotron-H's ``mixer.*``, Bamba's ``mamba.*``."""
LAYER_MAP = {
    "norm": ("ln1",),
    "input_layernorm": ("ln1",),
    "pre_ff_layernorm": ("ln2",),
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "self_attn.q_proj.bias": ("attn.q_proj.bias",),
    "self_attn.k_proj.bias": ("attn.k_proj.bias",),
    "self_attn.v_proj.bias": ("attn.v_proj.bias",),
    "self_attn.o_proj.bias": ("attn.output_proj.bias",),
    "feed_forward.gate_proj": ("ffn.w1",),
    "feed_forward.up_proj": ("ffn.w3",),
    "feed_forward.down_proj": ("ffn.w2",),
    "feed_forward.gate_proj.bias": ("ffn.w1.bias",),
    "feed_forward.up_proj.bias": ("ffn.w3.bias",),
    "feed_forward.down_proj.bias": ("ffn.w2.bias",),
    "mixer.up_proj.bias": ("ffn.fc.bias",),
    "post_attention_layernorm": ("ln2",),
    "shared_mlp.input_linear": ("ffn.w1", "ffn.w3"),  # Granite-4.0-H's fused gate and up
    "shared_mlp.output_linear": ("ffn.w2",),
    "block_sparse_moe.router": ("moe.router",),
    "mixer.gate": ("moe.router",),
    "mixer.experts": ("moe.experts.fc", "moe.experts.proj"),
    "mixer.experts.up_proj": ("moe.experts.fc",),
    "mixer.experts.down_proj": ("moe.experts.proj",),
    "mixer.shared_experts.up_proj": ("moe.shared.fc",),
    "mixer.shared_experts.down_proj": ("moe.shared.proj",),
    "mixer.shared_experts.up_proj.bias": ("moe.shared.fc.bias",),
    "mixer.shared_experts.down_proj.bias": ("moe.shared.proj.bias",),
    "mixer.fc1_latent_proj": ("moe.latent_in",),
    "mixer.fc2_latent_proj": ("moe.latent_out",),
    "mixer.fc1_latent_proj.bias": ("moe.latent_in.bias",),
    "mixer.fc2_latent_proj.bias": ("moe.latent_out.bias",),
    "block_sparse_moe.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "block_sparse_moe.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "block_sparse_moe.experts.down_proj": ("moe.experts.w2",),
    "mixer.down_proj.bias": ("ffn.proj.bias",),
    "mixer.q_proj": ("attn.q_proj",),
    "mixer.k_proj": ("attn.k_proj",),
    "mixer.v_proj": ("attn.v_proj",),
    "mixer.o_proj": ("attn.output_proj",),
    "mixer.up_proj": ("ffn.fc",),
    "mixer.down_proj": ("ffn.proj",),
    **{f"{module}.{name}": (f"mamba.{name}",) for name in MAMBA_NAMES for module in ("mixer", "mamba")},
}
TOP = {"model.embeddings": "token_embeddings", "model.norm_f": "ln_final", "lm_head": "lm_head"}
TOP |= {"model.embed_tokens": "token_embeddings", "model.final_layernorm": "ln_final"}  # Bamba's names
TOP |= {"model.norm": "ln_final"}  # Granite-4.0-H's
PREFIX = "model.layers."
our_keys = layer_keys(LAYER_MAP, TOP, PREFIX)
MOE_MAP = {  # Granite-4.0-H with routed experts: its shared_mlp is our one shared expert
    **LAYER_MAP,
    "shared_mlp.input_linear": ("moe.shared.w1", "moe.shared.w3"),
    "shared_mlp.output_linear": ("moe.shared.w2",),
}
moe_keys = layer_keys(MOE_MAP, TOP, PREFIX)


def keys_for(cfg):
    return moe_keys if cfg.moe else our_keys


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, keys_for(cfg), with_empty=False)  # a tied head has no tensor of its own


def test_parameters_by_hand():
    """Nemotron-H-8B's layers from modeling_nemotron_h.py: a Mamba2 mixer (in_proj d -> 2·H·P + 2·G·N + H, the conv's
    weight and bias over H·P + 2·G·N channels of K taps, dt_bias, A_log, D, the gated norm's H·P, out_proj), an
    attention layer (GQA, no bias), an MLP (up, down); one norm per block."""
    d, H, P, G, N, K = 4096, 128, 64, 8, 128, 4
    conv = H * P + 2 * G * N
    mamba = d * (2 * H * P + 2 * G * N + H) + conv * K + conv + 3 * H + H * P + H * P * d
    attention = d * 32 * 128 + 2 * d * 8 * 128 + 32 * 128 * d
    mlp = 2 * d * 21504
    total = 2 * 131072 * d + 24 * mamba + 4 * attention + 24 * mlp + 52 * d + d
    assert parameter_breakdown(config_from_hf(NEMOTRON_H_8B)).total == total == 8_100_852_736


@pytest.mark.parametrize(("name", "billions"), [("nemotron-h-8b", "8B"), ("nemotron-nano-9b-v2", "9B")])
def test_published_totals(name, billions):
    assert f"{parameter_breakdown(config_from_hf(CONFIGS[name])).total / 1e9:.0f}B" == billions


def test_nemotron_3_nano_totals():
    """Nemotron 3 Nano's card (as remembered): 31.6B in total, 3.2B active without the embedding table, 3.6B with
    it (a token's router picks 6 of 128 experts in each of the 23 MoE layers; the shared expert always runs)."""
    cfg = config_from_hf(NEMOTRON_3_NANO)
    table = 131072 * 2688
    assert f"{parameter_breakdown(cfg).total / 1e9:.1f}B" == "31.6B"
    assert f"{active_parameter_count(cfg) / 1e9:.1f}B" == "3.6B"
    assert f"{(active_parameter_count(cfg) - table) / 1e9:.1f}B" == "3.2B"
    idle = 23 * (128 - 6) * 2 * 2688 * 1856  # each idle expert's up_proj and down_proj
    assert active_parameter_count(cfg) == parameter_breakdown(cfg).total - idle


# -- forward FLOPs, module by module -----------------------------------------------------------------------------
def assert_equal_by_module(counted: dict[str, int], fwd, our_keys) -> None:
    """The total, every mapped module, and each mixer's own FLOPs (its module less its children): attention's eager
    QKᵀ and AV, the Mamba2 mixer's conv and SSD scan (functions, not modules).  The mixer is Nemotron-H's
    ``mixer`` (attention, Mamba2 or an MLP) or Bamba's ``self_attn`` or ``mamba``."""
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    own = {"attention": 0, "mamba": 0}
    for module, flops in counted.items():
        if module in TOP:
            by_keys[our_keys(module)] += flops
        elif module.startswith(PREFIX) and module.endswith((".mixer", ".mamba", ".self_attn")):
            children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == 4)
            if any(k.startswith(module + ".q_proj") for k in counted):
                own["attention"] += flops - children
            elif any(k.startswith(module + ".in_proj") for k in counted):
                own["mamba"] += flops - children
            else:
                assert flops == children  # an MLP does nothing but its two projections
        elif module.startswith(PREFIX) and module[len(PREFIX) :].partition(".")[2] in LAYER_MAP:
            by_keys[our_keys(module)] += flops  # a mapped module (not a container: Nemotron-H's shared_experts)
    mixers = {"layers.*.attn.qk", "layers.*.attn.av", "layers.*.mamba.conv1d", "layers.*.mamba.core"}
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - mixers
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    total = {key: fwd[key].total if key in fwd else 0 for key in mixers}  # a pattern may have no Mamba2 layer
    assert own["attention"] == total["layers.*.attn.qk"] + total["layers.*.attn.av"]
    assert own["mamba"] == total["layers.*.mamba.conv1d"] + total["layers.*.mamba.core"]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1000, 4096])
def test_forward_flops_equal_transformers_on_meta(name, seq, models, meta_masks):  # noqa: F811
    """The published sizes on meta (the torch path of the scan and the conv runs there), at 1,000 tokens (padded
    to 1,024 in the scan) and 4,096."""
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    assert_equal_by_module(hf_forward_flops(models[name], seq), forward_flops(cfg, seq), keys_for(cfg))


@pytest.fixture(scope="module")
def tiny_models():
    return {name: cpu_model(values) for name, values in TINY_CONFIGS.items()}


@pytest.mark.parametrize("name", TINY_CONFIGS)
@pytest.mark.parametrize(("batch", "seq"), [(1, 64), (2, 100)])
def test_forward_flops_equal_transformers_on_cpu(name, batch, seq, tiny_models):
    """Real tensors, two sequences, at a chunk multiple (64) and at 100 tokens (padded in the scan)."""
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    counted = cpu_forward_flops(tiny_models[name], batch, seq)
    assert_equal_by_module(counted, forward_flops(cfg, seq, batch), keys_for(cfg))


@pytest.mark.parametrize("seq", [96, 100])
def test_the_ssd_scan_and_the_conv_by_hand(seq):
    """transformers' own functions on random tensors: ``mamba2_chunk_scan`` at 96 tokens (3 chunks of 32) and 100
    (padded to 128: 4 chunks), counted by FlopCounterMode against the closed form written out,
    2·B·H·(K·C²·(N + P) + 2·K·C·P·N + (K + 1)²·P·N), and ``causal_conv1d_fn`` against 2·B·conv_dim·(S + K − 1)·K;
    the decode step's state update against 2·B·H·P·N."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.nemotron_h import modeling_nemotron_h as m

    B, H, P, G, N, C, K = 2, 4, 8, 2, 16, 32, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, seq, H, P, generator=g)
    dt, A = torch.rand(B, seq, H, generator=g), -torch.rand(H, generator=g)
    b, c = (torch.randn(B, seq, G, N, generator=g) for _ in range(2))
    with FlopCounterMode(display=False) as counter:
        m.mamba2_chunk_scan(x, dt, A, b, c, chunk_size=C, D=torch.ones(H), dt_softplus=True)
    chunks = -(-seq // C)
    assert counter.get_total_flops() == 2 * B * H * (
        chunks * C * C * (N + P) + 2 * chunks * C * P * N + (chunks + 1) ** 2 * P * N
    )
    cfg = ModelConfig(
        vocab_size=8, context_length=seq, num_layers=2, d_model=16, num_heads=2, d_ff=16, positions="none",
        layer_pattern="M*", mamba_heads=H, mamba_head_dim=P, mamba_state_size=N, mamba_groups=G,
        mamba_conv_kernel=K, mamba_chunk_size=C,
    )  # fmt: skip
    assert ssd_scan_flops(cfg, B, seq) == counter.get_total_flops()
    conv_dim = H * P + 2 * G * N
    xs, w, bias = (
        torch.randn(B, conv_dim, seq, generator=g),
        torch.randn(conv_dim, K, generator=g),
        torch.zeros(conv_dim),
    )
    with FlopCounterMode(display=False) as counter:
        m.causal_conv1d_fn(xs, w, bias, activation="silu")
    assert counter.get_total_flops() == 2 * B * conv_dim * (seq + K - 1) * K == mamba_conv_flops(cfg, B, seq)
    state = torch.zeros(B, H, P, N)
    with FlopCounterMode(display=False) as counter:
        m.mamba2_selective_state_update(
            state, x[:, 0], dt[:, 0, :, None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), b[:, 0], c[:, 0]
        )
    assert counter.get_total_flops() == 2 * B * H * P * N == ssd_step_flops(cfg, B)


CACHED = (
    "tiny-nemotron-h",
    "tiny-nemotron-h-moe",
    "tiny-granite-h-moe",
    "tiny-bamba",
    "tiny-granite-h",
    "tiny-falcon-h1",
)  # the same Mamba2 sizes: 8 heads of 8, 2 groups of 16, conv 4


@pytest.mark.parametrize("name", CACHED)
def test_decode_runs_the_recurrent_form(name, tiny_models):
    """A decode step of the tiny model with a cache, counted: the Mamba2 layers' conv update and state read-out (our
    decode rows), the attention layers against the p + 1 cached keys."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    model = tiny_models[name]
    B, P = 2, 70
    ids = torch.randint(0, 97, (B, P + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = model(input_ids=ids[:, :P], use_cache=True).past_key_values
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids[:, P:], past_key_values=cache, use_cache=True)
    step = decode_flops(cfg, P, B, P + 1)
    assert counter.get_total_flops() == step.total
    assert step["layers.*.mamba.core"].per_layer == 2 * B * 8 * 8 * 16


@pytest.mark.parametrize("name", CACHED)
@pytest.mark.parametrize("prompt", [2, 70])
def test_a_cached_prefill_equals_prefill_flops(prompt, name, tiny_models):
    """transformers' prefill into a cache, counted: ``prefill_flops``, with the conv's input padded to K = 4 by the
    cache when the prompt is shorter (2 tokens)."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    model = tiny_models[name]
    ids = torch.randint(0, 97, (2, prompt), generator=torch.Generator().manual_seed(4))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids, use_cache=True)
    assert counter.get_total_flops() == prefill_flops(cfg, prompt, 2, prompt + 1).total


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_training_flops_palm_still_equals_the_step(name):
    """PaLM's 6·N_matmul + attention term, with the SSD scan and the conv added as 3 x their forward, is the step."""
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    t = training_flops(cfg, 100, 2)
    assert t.palm == t.step


# -- the cache after a prefill -----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CACHED)
@pytest.mark.parametrize(("dtype", "name"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_cache_equals_transformers_after_a_prefill(dtype, name, config):
    """K and V on the attention layers, the conv state (B, conv_dim, K) in the model's dtype and the SSM state
    (B, H, P, N) in fp32 on the Mamba2 layers: the bytes of every tensor of transformers' cache."""
    cfg = config_from_hf(TINY_CONFIGS[config], name=config)
    model = cpu_model(TINY_CONFIGS[config]).to(dtype)
    B, P = 2, 70
    held, shapes = hybrid_cache_after_prefill(model, B, P)
    assert shapes == {((B, 8 * 8 + 2 * 2 * 16, 4), dtype), ((B, 8, 8, 16), torch.float32)}
    assert held == kv_cache_bytes(cfg, P, B, name)
    assert layer_slots(cfg, P) == [P if cfg.layer_attention(i) else 0 for i in range(cfg.num_layers)]


def test_infer_gives_the_hybrid_cache(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    args = ("--prompt", "70", "--generate", "2", "--batch", "2", "--program", "generate", "--format", "json")
    r = run_cli("infer", path, *args)
    assert r.code == 0, r.err
    memory = json.loads(r.out)["memory"]
    cfg = config_from_hf(TINY, name="tiny")
    # the cache of C = P + G − 1 = 71 positions: 1 attention layer's K and V, 3 Mamba2 layers' states (bf16 conv)
    kv = 1 * (2 * 2 * 16) * 71 * 2 * 2
    states = 3 * 2 * (128 * 4 * 2 + 8 * 8 * 16 * 4)
    assert memory["kv_cache"] == kv + states == kv_cache_bytes(cfg, 71, 2, "bf16") == 48_896


def test_transformers_parameter_tensors(tiny_models):
    """Every parameter tensor of transformers' tiny model in ``parameters()`` order, as the registry lists them."""
    from lm_accounting.components import components

    cfg = config_from_hf(TINY, name="tiny")
    ours = []
    for i in range(cfg.num_layers):
        ours += [c.key for c in components(cfg, "params") if c.in_layer(cfg, i)]
    theirs = [our_keys(n)[0] for n, _ in tiny_models["tiny-nemotron-h"].named_parameters() if n.startswith(PREFIX)]
    assert ours == theirs


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_transformers_parameter_tensor_sizes(name, tiny_models):
    """The numel of every parameter tensor of transformers' model, in ``parameters()`` order (the AdamW step
    counters and for-loop temporaries of ``memory --impl transformers``), and their count."""
    from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    real = [p.numel() for p in tiny_models[name].parameters()]
    assert hf_parameter_tensor_sizes(cfg) == real
    assert hf_parameter_tensor_count(cfg) == len(real)
    assert parameter_breakdown(cfg).total == sum(real)


# -- refusals: one line, exit 2 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("base", "change", "message"),
    [
        ("tiny-nemotron-h", {"num_hidden_layers": 8}, "the layer pattern lists 6 layers, num_hidden_layers is 8"),
        ("tiny-nemotron-h", {"hybrid_override_pattern": "M-E*-M", "n_routed_experts": None}, "'n_routed_experts'"),
        ("tiny-nemotron-h-moe", {"mlp_hidden_act": "silu"}, "'mlp_hidden_act' = 'silu' is not supported"),
        ("tiny-nemotron-h-moe", {"num_experts_per_tok": 9}, "experts_per_token=9 exceeds num_experts=8"),
        ("tiny-nemotron-h", {"hybrid_override_pattern": "M-X*-M"}, "must be a string of M, *, - and E"),
        ("tiny-nemotron-h", {"layers_block_type": ["mamba", "mlp"]}, "must be a list of"),
        ("tiny-nemotron-h", {"n_groups": 3}, "mamba_heads=8 is not divisible by mamba_groups=3"),
        ("tiny-nemotron-h", {"use_bias": True}, "field 'use_bias' = True is not supported"),
        ("tiny-nemotron-h", {"use_conv_bias": False}, "field 'use_conv_bias' = False is not supported"),
        ("tiny-nemotron-h", {"mamba_num_heads": None}, "mamba_num_heads"),
        ("tiny-nemotron-h", {"ssm_state_size": 0}, "field 'ssm_state_size' must be between 1 and 10^18"),
        ("tiny-nemotron-h", {"sliding_window": 64}, "field 'sliding_window' = 64 is not supported"),
        ("tiny-bamba", {"attn_layer_indices": [4]}, "names a layer outside 0..3"),
        ("tiny-bamba", {"attn_layer_indices": "1"}, "must be a list of layer indices"),
        ("tiny-bamba", {"mamba_d_head": 16}, "mamba_n_heads · mamba_d_head = 8 · 16 must be mamba_expand"),
        ("tiny-bamba", {"mamba_proj_bias": True}, "field 'mamba_proj_bias' = True is not supported"),
        ("tiny-granite-h", {"num_local_experts": 8}, "missing required field 'intermediate_size'"),
        ("tiny-granite-h", {"shared_intermediate_size": None}, "shared_intermediate_size"),
        ("tiny-granite-h", {"layer_types": ["mamba", "attention"]}, "lists 2 layers, num_hidden_layers is 4"),
        ("tiny-granite-h", {"position_embedding_type": "alibi"}, "field 'position_embedding_type' = 'alibi'"),
        ("tiny-granite-h", {"mamba_conv_bias": False}, "field 'mamba_conv_bias' = False is not supported"),
        ("tiny-falcon-h1", {"projectors_bias": True}, "field 'projectors_bias' = True is not supported"),
        ("tiny-falcon-h1", {"mamba_d_ssm": 100}, "8 · 12 must be mamba_d_ssm = 100"),
        ("tiny-falcon-h1", {"mamba_d_ssm": 96, "mamba_d_head": 8}, "8 · 8 must be mamba_d_ssm = 96"),
    ],
)
def test_a_bad_pattern_is_one_line(base, change, message, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIGS[base], **change}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


BASE = dict(vocab_size=8, context_length=8, num_layers=3, d_model=16, num_heads=2, d_ff=16, positions="none")
MAMBA = dict(mamba_heads=4, mamba_head_dim=4, mamba_state_size=8, mamba_groups=2, mamba_conv_kernel=4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mamba_heads": 4}, "applies only to Mamba2 layers"),
        ({"layer_pattern": "M*"}, "one letter per layer (3)"),
        ({"layer_pattern": "M*-", **MAMBA}, "need mamba_chunk_size"),
        ({"layer_pattern": "**-", **MAMBA, "mamba_chunk_size": 8}, "applies only to Mamba2 layers"),
        ({"layer_pattern": "M*-", **MAMBA, "mamba_chunk_size": 8, "sliding_window": 4}, "modelled as Nemotron-H's"),
        ({"layer_pattern": "M*-", **MAMBA, "mamba_chunk_size": 0}, "mamba_chunk_size must be positive"),
        ({"layer_pattern": "M*-", **MAMBA, "mamba_chunk_size": 8, "mixer_ffn": True}, "or H (both in parallel"),
        ({"mixer_ffn": True}, "mixer_ffn applies only to a layer pattern"),
        ({"layer_pattern": "*E-"}, "E layers need num_experts"),
        ({"layer_pattern": "*E-", "num_experts": 4, "experts_per_token": 2}, "experts of a 2-matrix mlp"),
        (
            {"layer_pattern": "*E-", "num_experts": 4, "experts_per_token": 2, "mlp": "relu2", "moe_every": 2},
            "moe_every",
        ),
        ({"layer_pattern": "*--", "num_experts": 4, "experts_per_token": 2, "mlp": "relu2"}, "needs E layers"),
        ({"layer_pattern": "*M-", **MAMBA, "mamba_chunk_size": 8, "expert_latent": 8}, "expert_latent applies only"),
    ],
)
def test_a_bad_model_config_is_refused(fields, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelConfig(**BASE, **fields)


def test_a_toml_pattern_is_the_config_json(tmp_path):
    """The same model from flat TOML keys (``layer_pattern`` and the ``mamba_*`` fields) as from its config.json."""
    from lm_accounting.config import load_config

    cfg = config_from_hf(TINY, name="tiny")
    keys = ("layer_pattern", "mamba_heads", "mamba_head_dim", "mamba_state_size", "mamba_groups")
    keys += ("mamba_conv_kernel", "mamba_chunk_size", "vocab_size", "context_length", "num_layers", "d_model")
    keys += ("num_heads", "num_kv_heads", "head_dim", "d_ff", "positions", "mlp", "norm_eps")
    text = "\n".join(f"{k} = {json.dumps(getattr(cfg, k))}" for k in keys)
    path = tmp_path / "tiny.toml"
    path.write_text(text + '\nname = "tiny"\n')
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('layer_pattern = "M*"', "layer_pattern must be one letter per layer (3)"),
        ('layer_pattern = "M*-"', "need mamba_heads"),
        ('layer_pattern = "M*-"\nmamba_heads = "8"', "key 'mamba_heads' must be int"),
        ("mamba_chunk_size = 64", "mamba_chunk_size applies only to Mamba2 layers"),
        ('layer_pattern = "M*Z"', "layer_pattern must be one letter per layer (3)"),
    ],
)
def test_a_bad_toml_pattern_is_one_line(lines, message, run_cli, tmp_path):
    """A TOML config's pattern keys, refused in one line with exit 2 (tests/test_hostile_config.py's rule)."""
    base = "vocab_size = 97\ncontext_length = 64\nnum_layers = 3\nd_model = 64\nnum_heads = 4\nd_ff = 96\n"
    path = tmp_path / "bad.toml"
    path.write_text(base + lines + "\n")
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_a_config_json_as_transformers_writes_it_reads_with_its_infinite_time_step_limit(tmp_path):
    """transformers saves ``time_step_limit`` = (0.0, inf) as ``[0.0, Infinity]`` (``json.dumps``): the file reads,
    to the same model as the fields without it (the limit changes no count)."""
    import json

    from lm_accounting.hf_config import load_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NEMOTRON_H_8B, "time_step_limit": [0.0, float("inf")]}))
    assert "Infinity" in path.read_text()
    read = load_hf_config(path)
    assert parameter_breakdown(read).total == parameter_breakdown(config_from_hf(NEMOTRON_H_8B)).total
