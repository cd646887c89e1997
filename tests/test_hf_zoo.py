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
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from test_transformers_truth import GPT2_MODULES, LLAMA_MODULES, QKV, TOP, build_hf, hf_forward_flops

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
    "helium": {**SMALL, "head_dim": 16},
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
}

# transformers' module names -> our component keys, beyond tests/test_transformers_truth.py's
ZOO_MODULES = {
    **LLAMA_MODULES,
    "self_attn.query_layernorm": ("attn.q_norm",),
    "self_attn.key_layernorm": ("attn.k_norm",),
    "mlp.router": ("moe.router",),
    "block_sparse_moe.router": ("moe.router",),
    "block_sparse_moe.router.layer": ("moe.router",),
    "block_sparse_moe.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "block_sparse_moe.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "block_sparse_moe.experts.down_proj": ("moe.experts.w2",),
    "shared_mlp.input_linear": ("moe.shared.w1", "moe.shared.w3"),
    "shared_mlp.output_linear": ("moe.shared.w2",),
    "mlp.c_fc": ("ffn.fc",),
    "mlp.c_proj": ("ffn.proj",),
}
POST_NORMS = {"post_attention_layernorm": ("post_attn_norm",)}  # OLMo-3, EXAONE 4: after the sublayers
LAYER = re.compile(r"^(?:model\.layers|transformer\.h)\.\d+\.(.+)$")


def zoo_keys(model_type: str, module: str, suffix: str = "") -> tuple[str, ...]:
    if module in TOP:
        return (TOP[module],)
    match = LAYER.match(module)
    assert match, module
    table = GPT2_MODULES if model_type == "gpt_bigcode" else ZOO_MODULES
    if model_type in ("olmo3", "exaone4"):
        table = {**table, **POST_NORMS}
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
        elif inner.split(".")[0] in ("self_attn", "attn", "mlp", "block_sparse_moe") and "." in inner:
            if not children and not inner.endswith(("_norm", "layernorm")):
                by_keys[zoo_keys(model_type, module)] += flops
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert core == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total


@pytest.fixture
def meta_masks(monkeypatch):
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda *args, **kwargs: None)


@pytest.mark.parametrize("model_type", ZOO)
def test_zoo_parameters_equal_transformers(model_type):
    check_parameters(model_type, ZOO[model_type])


@pytest.mark.parametrize("model_type", ZOO)
@pytest.mark.parametrize("seq", SEQS)
def test_zoo_forward_flops_equal_transformers(model_type, seq, meta_masks):
    check_flops(model_type, ZOO[model_type], seq)
