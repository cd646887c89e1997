"""LFM2 short-convolution hybrids (lfm2, lfm2_moe): parameters, forward FLOPs and the inference cache, exact against
transformers 5.24.

transformers' models/lfm2/modeling_lfm2.py: one ``Lfm2DecoderLayer`` per entry of ``layer_types``, ``operator_norm``,
the mixer, ``ffn_norm``, the ``feed_forward`` MLP (``layer_pattern`` with ``mixer_ffn``): on a "conv" layer (our
``C``) an ``Lfm2ShortConv`` (``in_proj`` d -> 3·d: B, C, x; B·x through a depthwise causal conv1d of ``conv_L_cache``
taps, ``conv_bias`` on the conv and both projections; C times its output; ``out_proj``), on a "full_attention" layer
``Lfm2Attention`` (GQA, no bias, per-head RMSNorms ``q_layernorm``/``k_layernorm``, RoPE, ``out_proj``); the MLP is a
SwiGLU (w1, w3, w2) whose width ``Lfm2MLP`` adjusts (``block_auto_adjust_ff_dim``: ``int(2·F/3)``, times
``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``); ``embedding_norm`` is the final norm.
models/lfm2_moe/modeling_lfm2_moe.py: the same layers; after ``num_dense_layers`` dense ones (an ``Lfm2MoeMLP`` of
``intermediate_size``, not adjusted) an ``Lfm2MoeSparseMoeBlock``: experts (``gate_up_proj``, ``down_proj``) of
``moe_intermediate_size``, a router ``gate.weight`` (d -> E, sigmoid scores; its ``expert_bias`` is a buffer).

Method: parameters by name on meta at full size; forward FLOPs with FlopCounterMode module by module on meta at full
size at 1,000 and 4,096 tokens, and on small real CPU tensors at 64 and 100 tokens with two sequences (experts as
``batched_mm``); the conv's own FLOPs (the ``Lfm2ShortConv`` module less its projections) against torch's
convolution formula over the S + K − 1 padded outputs; a decode step, a cached prefill (shorter and longer than the
conv) and the cache object after a prefill on CPU; every parameter tensor's numel in ``parameters()`` order.

The published configs are written as remembered (fields "from memory": LiquidAI/LFM2-1.2B's hub file with its legacy
``block_*`` and ``tie_embedding`` spellings and ``full_attn_idxs`` [2, 5, 8, 10, 12, 14]; LFM2-8B-A1B's 24
``layer_types``, 18 convolutions and 6 attention layers as its card says, the attention at 2, 6, ..., 22 as
remembered, not checked: their positions change no total).  Their totals are checked against the
model cards' (as remembered: LFM2-350M 354,483,968, LFM2-700M 742,489,344, LFM2-1.2B 1,170,340,608 parameters;
LFM2-8B-A1B "8.3B"), which also checks the MLP width rounding (350M: int(2·6,656/3) = 4,437 -> 4,608).
"""

import json
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import forward_flops, short_conv_flops, training_flops
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

LFM2_1_2B = {  # LiquidAI/LFM2-1.2B/config.json, from memory (see the module docstring)
    "architectures": ["Lfm2ForCausalLM"],
    "block_auto_adjust_ff_dim": True,
    "block_dim": 2048,
    "block_ff_dim": 12288,
    "block_ffn_dim_multiplier": 1.0,
    "block_mlp_init_scale": 1.0,
    "block_multiple_of": 256,
    "block_norm_eps": 1e-05,
    "block_out_init_scale": 1.0,
    "block_use_swiglu": True,
    "block_use_xavier_init": True,
    "bos_token_id": 1,
    "conv_L_cache": 3,
    "conv_bias": False,
    "conv_dim": 2048,
    "conv_dim_out": 2048,
    "conv_use_xavier_init": True,
    "eos_token_id": 7,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14],
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "max_position_embeddings": 128000,
    "model_type": "lfm2",
    "norm_eps": 1e-05,
    "num_attention_heads": 32,
    "num_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "rope_theta": 1000000.0,
    "theta": 1000000.0,
    "tie_embedding": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0.dev0",
    "use_cache": True,
    "use_pos_enc": True,
    "vocab_size": 65536,
}
LFM2_8B_A1B_TYPES = ["conv", "conv", "full_attention", "conv"] * 6  # 18 conv and 6 attention layers (the card's)
LFM2_8B_A1B = {  # LiquidAI/LFM2-8B-A1B/config.json, from memory (the attention layers' positions unchecked)
    "architectures": ["Lfm2MoeForCausalLM"],
    "bos_token_id": 1,
    "conv_L_cache": 3,
    "conv_bias": False,
    "dtype": "bfloat16",
    "eos_token_id": 7,
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 7168,
    "layer_types": LFM2_8B_A1B_TYPES,
    "max_position_embeddings": 128000,
    "model_type": "lfm2_moe",
    "moe_intermediate_size": 1792,
    "norm_eps": 1e-05,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_dense_layers": 2,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "rope_theta": 1000000.0,
    "routed_scaling_factor": 1.0,
    "tie_embedding": True,
    "use_cache": True,
    "use_expert_bias": True,
    "vocab_size": 65536,
}
LFM2_DEFAULTS = {  # Lfm2Config's defaults written out: every layer attention (full_attn_idxs None), no pattern
    "model_type": "lfm2",
    "vocab_size": 65536,
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 128000,
}
CONFIGS = {
    "lfm2-defaults": LFM2_DEFAULTS,
    "lfm2-1.2b": LFM2_1_2B,
    "lfm2-8b-a1b": LFM2_8B_A1B,
    "lfm2-350m": {**LFM2_1_2B, "hidden_size": 1024, "block_ff_dim": 6656, "num_attention_heads": 16},
    "lfm2-700m": {**LFM2_1_2B, "hidden_size": 1536, "block_ff_dim": 10240, "num_attention_heads": 24},
}

TINY = {  # small enough for real CPU tensors: 3 conv layers and 1 attention layer
    "model_type": "lfm2",
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "layer_types": ["conv", "full_attention", "conv", "conv"],
    "block_multiple_of": 16,
}
TINY_MOE = {
    **{k: v for k, v in TINY.items() if not k.startswith("block_")},
    "model_type": "lfm2_moe",
    "moe_intermediate_size": 32,
    "num_dense_layers": 1,
    "num_experts": 8,
    "num_experts_per_tok": 2,
}
TINY_CONFIGS = {
    "tiny-lfm2": TINY,
    "tiny-lfm2-bias": {  # conv_bias on the conv and both projections; an MLP width not adjusted; a 4-tap conv
        **TINY,
        "conv_bias": True,
        "conv_L_cache": 4,
        "block_auto_adjust_ff_dim": False,
        "tie_word_embeddings": False,
    },
    "tiny-lfm2-idxs": {  # layer_types derived from full_attn_idxs; a multiplier and its rounding; head_dim given
        **{k: v for k, v in TINY.items() if k != "layer_types"},
        "full_attn_idxs": [0, 3],
        "block_ffn_dim_multiplier": 1.3,
        "head_dim": 8,
    },
    "tiny-lfm2-moe": TINY_MOE,
    "tiny-lfm2-moe-bias": {**TINY_MOE, "conv_bias": True, "use_expert_bias": False, "num_dense_layers": 0},
}

LAYER_MAP = {
    "operator_norm": ("ln1",),
    "ffn_norm": ("ln2",),
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.out_proj": ("attn.output_proj",),
    "self_attn.q_layernorm": ("attn.q_norm",),
    "self_attn.k_layernorm": ("attn.k_norm",),
    "conv.conv": ("conv.conv1d",),
    "conv.conv.bias": ("conv.conv1d.bias",),
    "conv.in_proj": ("conv.in_proj",),
    "conv.in_proj.bias": ("conv.in_proj.bias",),
    "conv.out_proj": ("conv.out_proj",),
    "conv.out_proj.bias": ("conv.out_proj.bias",),
    "feed_forward.w1": ("ffn.w1",),
    "feed_forward.w3": ("ffn.w3",),
    "feed_forward.w2": ("ffn.w2",),
    "feed_forward.gate": ("moe.router",),
    "feed_forward.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "feed_forward.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "feed_forward.experts.down_proj": ("moe.experts.w2",),
}
TOP = {"model.embed_tokens": "token_embeddings", "model.embedding_norm": "ln_final", "lm_head": "lm_head"}
PREFIX = "model.layers."
our_keys = layer_keys(LAYER_MAP, TOP, PREFIX)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, our_keys, with_empty=False)  # a tied head has no tensor of its own


def test_parameters_by_hand():
    """LFM2-1.2B's layers from modeling_lfm2.py: a short conv (conv d·K, in_proj d·3d, out_proj d·d), an attention
    (GQA 32/8 heads of 64, no bias, two per-head norms of 64), a SwiGLU of int(2·12,288/3) = 8,192 rounded up to 256
    (8,192) in every layer, two norms per layer, the final norm; the head tied."""
    d, K, F = 2048, 3, 8192
    conv = d * K + 3 * d * d + d * d
    attention = d * 32 * 64 + 2 * d * 8 * 64 + 32 * 64 * d + 2 * 64
    total = 65536 * d + 10 * conv + 6 * attention + 16 * (3 * d * F + 2 * d) + d
    assert parameter_breakdown(config_from_hf(LFM2_1_2B)).total == total == 1_170_340_608


@pytest.mark.parametrize(
    ("name", "total"), [("lfm2-350m", 354_483_968), ("lfm2-700m", 742_489_344), ("lfm2-1.2b", 1_170_340_608)]
)
def test_published_totals(name, total):
    assert parameter_breakdown(config_from_hf(CONFIGS[name])).total == total


def test_lfm2_8b_a1b_totals():
    """The card's 8.3B in total (as remembered); active: every idle expert's gate_up_proj and down_proj left out."""
    cfg = config_from_hf(LFM2_8B_A1B)
    assert f"{parameter_breakdown(cfg).total / 1e9:.1f}B" == "8.3B"
    idle = 22 * (32 - 4) * 3 * 2048 * 1792
    assert active_parameter_count(cfg) == parameter_breakdown(cfg).total - idle


@pytest.mark.parametrize(
    ("fields", "width"),
    [
        ({}, 64),  # int(2·96/3) = 64, × 1.0, a multiple of 16
        ({"block_ffn_dim_multiplier": 1.3}, 96),  # int(1.3 · 64) = 83 -> 96
        ({"intermediate_size": 100}, 80),  # int(200/3) = 66 -> 80
        ({"block_ffn_dim_multiplier": 2}, 128),  # an int multiplier
        ({"block_auto_adjust_ff_dim": False, "intermediate_size": 100}, 100),
        ({"block_multiple_of": 256}, 256),
        ({"block_ff_dim": 150, "intermediate_size": 9}, 112),  # the legacy name wins: int(100 · 1.0) -> 112
    ],
)
def test_the_mlp_width_is_transformers_arithmetic(fields, width):
    """``Lfm2MLP``'s adjusted width, read off the real model's w1 (``d_ff``), for several fields."""
    values = {**TINY, **fields}
    model = cpu_model(values)
    assert model.model.layers[0].feed_forward.w1.weight.shape[0] == width
    assert config_from_hf(values).d_ff == width


# -- forward FLOPs, module by module -----------------------------------------------------------------------------
def assert_equal_by_module(counted: dict[str, int], fwd) -> None:
    """The total, every mapped module, and each mixer's own FLOPs (its module less its children): attention's eager
    QKᵀ and AV, and the short conv's conv1d (a function, ``causal_conv1d_fn``, not its ``conv`` module)."""
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    own = {"self_attn": 0, "conv": 0}
    for module, flops in counted.items():
        inner = module[len(PREFIX) :].partition(".")[2] if module.startswith(PREFIX) else None
        if module in TOP:
            by_keys[our_keys(module)] += flops
        elif inner in own:
            children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == 4)
            own[inner] += flops - children
        elif inner in LAYER_MAP:
            by_keys[our_keys(module)] += flops
    mixers = {"layers.*.attn.qk", "layers.*.attn.av", "layers.*.conv.conv1d"}
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - mixers
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    total = {key: fwd[key].total if key in fwd else 0 for key in mixers}  # all attention: no conv
    assert own["self_attn"] == total["layers.*.attn.qk"] + total["layers.*.attn.av"]
    assert own["conv"] == total["layers.*.conv.conv1d"]


def test_all_attention_is_no_pattern():
    """Lfm2Config's defaults (every layer attention): Llama's blocks with per-head qk-norm, no layer pattern."""
    cfg = config_from_hf(LFM2_DEFAULTS)
    assert cfg.layer_pattern is None and not cfg.mixer_ffn and cfg.qk_norm and cfg.d_ff == 8192


@pytest.mark.parametrize("name", ["lfm2-defaults", "lfm2-1.2b", "lfm2-8b-a1b"])
@pytest.mark.parametrize("seq", [1000, 4096])
def test_forward_flops_equal_transformers_on_meta(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    assert_equal_by_module(hf_forward_flops(models[name], seq), forward_flops(cfg, seq))


@pytest.fixture(scope="module")
def tiny_models():
    return {name: cpu_model(values) for name, values in TINY_CONFIGS.items()}


@pytest.mark.parametrize("name", TINY_CONFIGS)
@pytest.mark.parametrize(("batch", "seq"), [(1, 64), (2, 100)])
def test_forward_flops_equal_transformers_on_cpu(name, batch, seq, tiny_models):
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    assert_equal_by_module(cpu_forward_flops(tiny_models[name], batch, seq), forward_flops(cfg, seq, batch))


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_parameters_equal_transformers_on_cpu(name, tiny_models):
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    assert_parameters_equal(cfg, tiny_models[name], our_keys, with_empty=False)


@pytest.mark.parametrize("seq", [5, 100])
def test_the_conv_by_hand(seq):
    """transformers' ``causal_conv1d_fn`` on random (B, d, S) inputs, counted, against the closed form written out:
    2·B·d·(S + K − 1)·K (torch's convolution formula: the S + K − 1 padded outputs, K taps each)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.lfm2 import modeling_lfm2 as m

    B, d, K = 2, 24, 3
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(B, d, seq, generator=g), torch.randn(d, K, generator=g)
    with FlopCounterMode(display=False) as counter:
        m.causal_conv1d_fn(x, w, None)
    cfg = ModelConfig(
        vocab_size=8, context_length=seq, num_layers=2, d_model=d, num_heads=2, d_ff=16, layer_pattern="C*",
        mixer_ffn=True, short_conv_kernel=K,
    )  # fmt: skip
    assert counter.get_total_flops() == 2 * B * d * (seq + K - 1) * K == short_conv_flops(cfg, B, seq)


CACHED = ("tiny-lfm2", "tiny-lfm2-bias", "tiny-lfm2-moe")


@pytest.mark.parametrize("name", CACHED)
def test_a_decode_step_equals_decode_flops(name, tiny_models):
    """A decode step with a cache, counted: the conv layers' ``causal_conv1d_update`` (2·B·d·2·K), the attention
    layer against the p + 1 cached keys."""
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
    assert step["layers.*.conv.conv1d"].per_layer == 2 * B * 64 * 2 * cfg.short_conv_kernel


@pytest.mark.parametrize("name", CACHED)
@pytest.mark.parametrize("prompt", [2, 70])
def test_a_cached_prefill_equals_prefill_flops(prompt, name, tiny_models):
    """transformers' prefill into a cache, counted: ``prefill_flops``, with the conv's input padded to K by the cache
    when the prompt is shorter (2 tokens)."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    ids = torch.randint(0, 97, (2, prompt), generator=torch.Generator().manual_seed(4))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        tiny_models[name](input_ids=ids, use_cache=True)
    assert counter.get_total_flops() == prefill_flops(cfg, prompt, 2, prompt + 1).total


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_training_flops_palm_still_equals_the_step(name):
    """PaLM's 6·N_matmul + attention term, with the conv added as 3 x its forward, is the step."""
    t = training_flops(config_from_hf(TINY_CONFIGS[name], name=name), 100, 2)
    assert t.palm == t.step


# -- the cache after a prefill -----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CACHED)
@pytest.mark.parametrize(("dtype", "name"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_cache_equals_transformers_after_a_prefill(dtype, name, config):
    """K and V on the attention layer and the conv state (B, d, K) in the model's dtype on the conv layers: the bytes
    of every tensor of transformers' cache."""
    cfg = config_from_hf(TINY_CONFIGS[config], name=config)
    model = cpu_model(TINY_CONFIGS[config]).to(dtype)
    B, P = 2, 70
    held, shapes = hybrid_cache_after_prefill(model, B, P)
    assert shapes == {((B, 64, cfg.short_conv_kernel), dtype)}
    assert held == kv_cache_bytes(cfg, P, B, name)
    assert layer_slots(cfg, P) == [P if cfg.layer_attention(i) else 0 for i in range(cfg.num_layers)]


def test_the_engines_are_refused_in_one_line(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    r = run_cli("infer", path, "--prompt", "70", "--generate", "2", "--engine", "vllm")
    assert r.code == 2 and "short-convolution layers keep their states" in r.err and r.err.count("\n") <= 1, r.err


def test_infer_gives_the_hybrid_cache(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    args = ("--prompt", "70", "--generate", "2", "--batch", "2", "--program", "generate", "--format", "json")
    r = run_cli("infer", path, *args)
    assert r.code == 0, r.err
    memory = json.loads(r.out)["memory"]
    cfg = config_from_hf(TINY, name="tiny")
    # the cache of C = P + G − 1 = 71 positions: 1 attention layer's K and V, 3 conv layers' (B, d, K) states, bf16
    kv = 1 * (2 * 2 * 16) * 71 * 2 * 2
    states = 3 * 2 * 64 * 3 * 2
    assert memory["kv_cache"] == kv + states == kv_cache_bytes(cfg, 71, 2, "bf16") == 20_480


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_transformers_parameter_tensor_sizes(name, tiny_models):
    """The numel of every parameter tensor of transformers' model, in ``parameters()`` order, and their count."""
    from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    real = [p.numel() for p in tiny_models[name].parameters()]
    assert hf_parameter_tensor_sizes(cfg) == real
    assert hf_parameter_tensor_count(cfg) == len(real)


# -- bad input: one line -----------------------------------------------------------------------------------------
DROP = object()  # a field left out of the file


@pytest.mark.parametrize(
    ("base", "change", "message"),
    [
        (TINY, {"layer_types": ["conv", "mamba", "conv", "conv"]}, "'conv' / 'full_attention'"),
        (TINY, {"layer_types": ["conv"] * 3}, "lists 3 layers, num_hidden_layers is 4"),
        (TINY, {"layer_types": DROP, "full_attn_idxs": "0"}, "full_attn_idxs' must be a list"),
        (TINY_MOE, {"layer_types": DROP}, "missing required field 'layer_types'"),
        (TINY, {"block_ffn_dim_multiplier": 0.001}, "adjusted width is 0"),
        (TINY, {"conv_L_cache": 0}, "conv_L_cache' must be between 1"),
        (TINY, {"block_ffn_dim_multiplier": None}, "block_ffn_dim_multiplier"),
        (TINY_MOE, {"num_dense_layers": 4}, "no layer is a mixture of experts"),
        ({**TINY, "model_type": "lfm3"}, {}, "LFM3's Lfm3DecoderLayer"),
    ],
)
def test_a_bad_config_json_is_one_line(base, change, message, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in {**base, **change}.items() if v is not DROP}))
    r = run_cli("account", path)
    assert r.code == 2 and message in r.err and r.err.count("\n") <= 1, r.err


BASE = dict(vocab_size=8, context_length=8, num_layers=3, d_model=16, num_heads=2, d_ff=16)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(layer_pattern="C*C", mixer_ffn=True), "need short_conv_kernel"),
        (dict(layer_pattern="C*C", short_conv_kernel=3), "layer_pattern must be one letter per layer"),
        (dict(layer_pattern="***", mixer_ffn=True, short_conv_kernel=3), "apply only to short-convolution layers"),
        (dict(short_conv_kernel=3), "apply only to a layer pattern's C layers"),
        (dict(short_conv_bias=True), "apply only to a layer pattern's C layers"),
        (dict(layer_pattern="C*C", mixer_ffn=True, short_conv_kernel=0), "short_conv_kernel"),
    ],
)
def test_a_bad_model_config_is_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**BASE, **fields)


def test_a_toml_pattern_is_the_config_json(tmp_path):
    from lm_accounting.config import load_config

    cfg = config_from_hf(TINY, name="tiny")
    keys = ("layer_pattern", "mixer_ffn", "short_conv_kernel", "short_conv_bias", "qk_norm", "tie_embeddings")
    lines = [f"{k} = {json.dumps(getattr(cfg, k))}" for k in keys]
    lines += [f"{k} = {getattr(cfg, k)}" for k in ("vocab_size", "context_length", "num_layers", "d_model", "d_ff")]
    lines += [f"num_heads = {cfg.num_heads}", f"num_kv_heads = {cfg.kv_heads}", f"rope_theta = {cfg.rope_theta}"]
    path = tmp_path / "tiny.toml"
    path.write_text("\n".join(lines) + "\n")
    toml = load_config(path)
    assert parameter_breakdown(toml).total == parameter_breakdown(cfg).total
    assert forward_flops(toml, 100, 2).total == forward_flops(cfg, 100, 2).total
