"""State-space models (Mamba2, Mamba, Falcon-Mamba) and the Jamba hybrid: parameters, forward FLOPs and the inference
cache, exact against transformers 5.24.

transformers' models/mamba2/modeling_mamba2.py: ``Mamba2ForCausalLM`` is ``backbone.embeddings``, one ``Mamba2Block``
per layer (``x + mixer(norm(x))``: an RMSNorm and a ``Mamba2Mixer``, the mixer of Nemotron-H's ``M`` layers: ``in_proj``
to z, x, B, C and dt, a depthwise causal conv1d with a bias over x, B, C, ``dt_bias``, ``A_log``, ``D``, the chunked
SSD scan ``mamba2_chunk_scan``, the gated RMSNorm per group, ``out_proj``), ``backbone.norm_f`` and ``lm_head`` (tied by
``tie_word_embeddings``).  lm-accounting reads it as a ``layer_pattern`` of ``M`` only (``hf_config._mamba2``).  models/mamba/modeling_mamba.py:
``MambaForCausalLM``, the same layout with a ``MambaMixer`` (``A_log`` E x N, ``D``, a depthwise conv1d with a bias
over x, ``in_proj`` to x and z, ``x_proj`` to dt's rank and B and C, ``dt_proj`` with a bias, applied as
``dt_proj.weight @``, the sequential selective scan ``mamba_selective_scan``, ``out_proj``), read as a pattern of
``S`` (``hf_config._mamba``); models/falcon_mamba: the same with weightless RMSNorms on dt, B and C
(``hf_config._falcon_mamba``).  models/jamba/modeling_jamba.py: ``JambaForCausalLM``, Llama's two-sublayer block
whose mixer is GQA attention without positions (``JambaAttention``) on the layers i % ``attn_layer_period`` =
``attn_layer_offset`` and a ``JambaMambaMixer`` (Mamba's, with RMSNorms with gains on dt, B and C) on the others, and
whose FFN is a ``JambaSparseMoeBlock`` (router, SwiGLU experts with gate and up fused) on the layers i %
``expert_layer_period`` = ``expert_layer_offset``, a SwiGLU ``JambaMLP`` on the others (``hf_config._jamba``).

Method (tests/test_arch_mamba2.py's): parameters by name on meta at full size; forward FLOPs with FlopCounterMode
module by module on meta at full size at 1,000 and 4,096 tokens, and on small real CPU tensors at 64 and 100 tokens
(chunks of 32: a multiple and not) with two sequences; a decode step, a cached prefill and the cache against the
cache transformers returns after a prefill, on CPU.

The full-size config: mistralai/Mamba-Codestral-7B-v0.1's config.json, written from memory (its sizes are
``Mamba2Config``'s defaults: hidden 4,096, 64 layers, 128 heads of 64, 8 groups of state 128, conv 4, chunks of 256,
vocabulary 32,768, untied); the card's 7,285,403,648 parameters (as remembered) is checked below.
state-spaces/mamba-130m-hf's config.json (from memory: hidden 768, 24 layers, state 16, dt rank 48, vocabulary
50,280, tied; "130m" checked) and tiiuae/falcon-mamba-7b's (from memory: hidden 4,096, 64 layers, expand 2, state 16,
dt rank 256, vocabulary 65,024, untied; the card's 7.27B checked); ai21labs/Jamba-v0.1's is ``JambaConfig``'s
defaults (the class's docstring names it; the card's 52B total and 12B active checked).
"""

import json
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import forward_flops, training_flops
from lm_accounting.analytic.inference import decode_flops, prefill_flops
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
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

CODESTRAL_MAMBA = {  # mistralai/Mamba-Codestral-7B-v0.1/config.json, from memory (see the module docstring)
    "architectures": ["Mamba2ForCausalLM"],
    "bos_token_id": 0,
    "chunk_size": 256,
    "conv_kernel": 4,
    "eos_token_id": 0,
    "expand": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.1,
    "layer_norm_epsilon": 1e-05,
    "model_type": "mamba2",
    "n_groups": 8,
    "norm_before_gate": True,  # not a Mamba2Config field in transformers 5.24: ignored
    "num_heads": 128,
    "num_hidden_layers": 64,
    "pad_token_id": 0,
    "rescale_prenorm_residual": False,
    "residual_in_fp32": True,
    "rms_norm": True,  # likewise
    "state_size": 128,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "time_step_rank": 256,
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "vocab_size": 32768,
}
MAMBA_130M = {  # state-spaces/mamba-130m-hf/config.json, from memory
    "architectures": ["MambaForCausalLM"],
    "bos_token_id": 0,
    "conv_kernel": 4,
    "eos_token_id": 0,
    "expand": 2,
    "hidden_act": "silu",
    "hidden_size": 768,
    "initializer_range": 0.1,
    "intermediate_size": 1536,
    "layer_norm_epsilon": 1e-05,
    "model_type": "mamba",
    "n_layer": 24,  # not a MambaConfig field: ignored
    "num_hidden_layers": 24,
    "pad_token_id": 0,
    "rescale_prenorm_residual": False,
    "residual_in_fp32": True,
    "state_size": 16,
    "time_step_floor": 0.0001,
    "time_step_init_scheme": "random",
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "time_step_rank": 48,
    "time_step_scale": 1.0,
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "vocab_size": 50280,
}
FALCON_MAMBA_7B = {  # tiiuae/falcon-mamba-7b/config.json, from memory (expand 2: intermediate_size 8,192)
    "architectures": ["FalconMambaForCausalLM"],
    "bos_token_id": 0,
    "conv_kernel": 4,
    "eos_token_id": 11,
    "expand": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.1,
    "intermediate_size": 8192,
    "layer_norm_epsilon": 1e-05,
    "mixer_rms_eps": 1e-06,
    "model_type": "falcon_mamba",
    "num_hidden_layers": 64,
    "pad_token_id": 11,
    "rescale_prenorm_residual": False,
    "residual_in_fp32": True,
    "state_size": 16,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_init_scheme": "random",
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "time_step_rank": 256,
    "time_step_scale": 1.0,
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "vocab_size": 65024,
}
JAMBA_V01 = {  # ai21labs/Jamba-v0.1: JambaConfig's defaults, its shape fields written out
    "model_type": "jamba",
    "vocab_size": 65536,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 262144,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 256,
    "tie_word_embeddings": False,
}
CONFIGS = {
    "mamba-codestral-7b": CODESTRAL_MAMBA,
    "mamba-130m": MAMBA_130M,
    "falcon-mamba-7b": FALCON_MAMBA_7B,
    "jamba-v0.1": JAMBA_V01,
}

TINY_MAMBA2 = {  # small enough for real CPU tensors: 8 heads of 8 (expand 1), 2 groups of 16, chunks of 32
    "model_type": "mamba2",
    "vocab_size": 97,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_heads": 8,
    "head_dim": 8,
    "expand": 1,
    "state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 32,
}
TINY_MAMBA = {  # E = 2·48 = 96 channels, state 8, dt rank "auto" = ⌈48/16⌉ = 3, conv 4, tied (the class's default)
    "model_type": "mamba",
    "vocab_size": 97,
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "state_size": 8,
    "conv_kernel": 4,
}
TINY_CONFIGS = {
    "tiny-mamba2": TINY_MAMBA2,
    "tiny-mamba2-tied": {**TINY_MAMBA2, "tie_word_embeddings": True, "expand": 2, "head_dim": 16, "conv_kernel": 3},
    "tiny-mamba": TINY_MAMBA,
    "tiny-mamba-untied": {
        **TINY_MAMBA,
        "tie_word_embeddings": False,
        "expand": 3,
        "time_step_rank": 5,
        "conv_kernel": 3,
    },
    "tiny-falcon-mamba": {**TINY_MAMBA, "model_type": "falcon_mamba", "mixer_rms_eps": 1e-5, "state_size": 12},
    "tiny-jamba": {  # layers S*SS*S: attention on 1 and 4 (period 3, offset 1), 4 experts top-2 on 1, 3, 5
        "model_type": "jamba",
        "vocab_size": 97,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "attn_layer_period": 3,
        "attn_layer_offset": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
    },
    "tiny-jamba-dense": {  # one expert: every FFN a JambaMLP; attention on 0 and 2, heads of 16, dt rank 5, tied
        "model_type": "jamba",
        "vocab_size": 97,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "attn_layer_period": 2,
        "attn_layer_offset": 0,
        "num_experts": 1,
        "mamba_d_state": 8,
        "mamba_d_conv": 3,
        "mamba_expand": 1,
        "mamba_dt_rank": 5,
        "tie_word_embeddings": True,
    },
}

MAMBA2_NAMES = ("in_proj", "conv1d", "conv1d.bias", "dt_bias", "A_log", "D", "norm", "out_proj")
MAMBA_NAMES = ("A_log", "D", "conv1d", "conv1d.bias", "in_proj", "x_proj", "dt_proj", "dt_proj.bias", "out_proj")
FALCON_NORMS = {"dt_layernorm": "dt_rms", "b_layernorm": "b_rms", "c_layernorm": "c_rms"}  # no parameter, no FLOP
JAMBA_NORMS = ("dt_layernorm", "b_layernorm", "c_layernorm")
LAYER_MAP = {"norm": ("ln1",), **{f"mixer.{n}": (f"mamba.{n}",) for n in MAMBA2_NAMES}}
SSM_MAP = {"norm": ("ln1",), **{f"mixer.{n}": (f"ssm.{n}",) for n in MAMBA_NAMES}}
SSM_MAP |= {f"mixer.{theirs}": (f"ssm.{ours}",) for theirs, ours in FALCON_NORMS.items()}
JAMBA_MAP = {
    "input_layernorm": ("ln1",),
    "pre_ff_layernorm": ("ln2",),
    **{f"mamba.{n}": (f"ssm.{n}",) for n in (*MAMBA_NAMES, *JAMBA_NORMS)},
    **{f"self_attn.{n}_proj": (f"attn.{n}_proj",) for n in "qkv"},
    "self_attn.o_proj": ("attn.output_proj",),
    "feed_forward.gate_proj": ("ffn.w1",),
    "feed_forward.up_proj": ("ffn.w3",),
    "feed_forward.down_proj": ("ffn.w2",),
    "feed_forward.router": ("moe.router",),
    "feed_forward.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "feed_forward.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "feed_forward.experts.down_proj": ("moe.experts.w2",),
}
JAMBA_TOP = {"model.embed_tokens": "token_embeddings", "model.final_layernorm": "ln_final", "lm_head": "lm_head"}
TOP = {"backbone.embeddings": "token_embeddings", "backbone.norm_f": "ln_final", "lm_head": "lm_head"}
PREFIX = "backbone.layers."
MAMBA2_KEYS = layer_keys(LAYER_MAP, TOP, PREFIX)
SSM_KEYS = layer_keys(SSM_MAP, TOP, PREFIX)
JAMBA_KEYS = layer_keys(JAMBA_MAP, JAMBA_TOP, "model.layers.")
OWN = {  # the mixer's own FLOPs (its module less its children): functions and weights applied by hand, not modules
    "mamba2": ("layers.*.mamba.conv1d", "layers.*.mamba.core"),
    "ssm": ("layers.*.ssm.conv1d", "layers.*.ssm.dt_proj", "layers.*.ssm.core"),
}


def keys_of(cfg):
    if cfg.hf_model_type == "jamba":
        return JAMBA_KEYS
    return SSM_KEYS if cfg.ssm_layers else MAMBA2_KEYS


def assert_equal_by_module(counted: dict[str, int], fwd, cfg) -> None:
    """The total, every mapped module, and each mixer's own FLOPs (its module less its children) equal to ours for
    the conv and the scan (functions, not modules) and Mamba's ``dt_proj.weight @`` (``OWN``), and Jamba's attention
    core (eager QKᵀ and AV)."""
    mixer = set(OWN["ssm" if cfg.ssm_layers else "mamba2"])
    jamba = cfg.hf_model_type == "jamba"
    our_keys, top, prefix = (JAMBA_KEYS, JAMBA_TOP, "model.layers.") if jamba else (keys_of(cfg), TOP, PREFIX)
    layer_map = JAMBA_MAP if jamba else SSM_MAP if cfg.ssm_layers else LAYER_MAP
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    own = {"ssm": 0, "attention": 0}
    for module, flops in counted.items():
        if module in top:
            by_keys[our_keys(module)] += flops
        elif module.startswith(prefix) and module.endswith((".mixer", ".mamba", ".self_attn")):
            children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == 4)
            own["attention" if module.endswith(".self_attn") else "ssm"] += flops - children
        elif module.startswith(prefix) and module[len(prefix) :].partition(".")[2] in layer_map:
            by_keys[our_keys(module)] += flops
    core = {"layers.*.attn.qk", "layers.*.attn.av"} & {it.key for it in fwd}
    assert {k for keys in by_keys for k in keys if by_keys[keys]} == {it.key for it in fwd} - mixer - core
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total if k in fwd else 0 for k in keys) == flops, (keys, flops)
    assert own["ssm"] == sum(fwd[k].total for k in mixer)
    assert own["attention"] == sum(fwd[k].total for k in core)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.fixture(scope="module")
def tiny_models():
    return {name: cpu_model(values) for name, values in TINY_CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    assert_parameters_equal(cfg, models[name], keys_of(cfg), with_empty=False)


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_tiny_parameters_equal_transformers(name, tiny_models):
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    assert_parameters_equal(cfg, tiny_models[name], keys_of(cfg), with_empty=False)


def test_codestral_mamba_by_hand_and_the_card():
    """modeling_mamba2.py's layer: in_proj d -> 2·H·P + 2·G·N + H, the conv's weight and bias over H·P + 2·G·N
    channels of K taps, dt_bias, A_log, D, the gated norm's H·P, out_proj, the block's norm; the card's total."""
    d, H, P, G, N, K = 4096, 128, 64, 8, 128, 4
    conv = H * P + 2 * G * N
    layer = d * (2 * H * P + 2 * G * N + H) + conv * K + conv + 3 * H + H * P + H * P * d + d
    total = 2 * 32768 * d + 64 * layer + d
    assert parameter_breakdown(config_from_hf(CODESTRAL_MAMBA)).total == total == 7_285_403_648


def test_mamba_by_hand_and_the_cards():
    """modeling_mamba.py's layer: A_log E·N, D E, the conv's weight and bias E·K + E, in_proj d·2E, x_proj
    E·(R + 2N), dt_proj R·E + E, out_proj E·d, the block's norm d; Mamba-130m (tied) and Falcon-Mamba-7B (untied;
    its dt/B/C norms have no parameter) against their names and cards (129M, 7.27B)."""

    def total(d, layers, vocab, n, r, tied):
        e = 2 * d
        layer = e * n + e + e * 4 + e + d * 2 * e + e * (r + 2 * n) + r * e + e + e * d + d
        return vocab * d * (1 if tied else 2) + layers * layer + d

    assert parameter_breakdown(config_from_hf(MAMBA_130M)).total == total(768, 24, 50280, 16, 48, True) == 129_135_360
    falcon = parameter_breakdown(config_from_hf(FALCON_MAMBA_7B)).total
    assert falcon == total(4096, 64, 65024, 16, 256, False) == 7_272_665_088


FLOP_LAYERS = {"mamba-codestral-7b": 64, "mamba-130m": 4, "falcon-mamba-7b": 4, "jamba-v0.1": 8}
"""Layers built for the FLOP count on meta: Mamba's sequential scan runs S Python steps per layer, so the Mamba (v1)
configs keep 4 of their layers (every layer is the same), Jamba 8 (one attention layer, 4 MoE layers); the full-size
parameters are checked above."""


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1000, 4096])
def test_forward_flops_equal_transformers_on_meta(name, seq, meta_masks):  # noqa: F811
    """The published widths on meta (the torch paths of the scans and the conv run there), at 1,000 tokens (padded
    to 1,024 in Mamba2's chunked scan) and 4,096."""
    values = {**CONFIGS[name], "num_hidden_layers": FLOP_LAYERS[name]}
    cfg = config_from_hf(values, name=name).with_context(seq)
    assert_equal_by_module(hf_forward_flops(build_hf(values), seq), forward_flops(cfg, seq), cfg)


@pytest.mark.parametrize("name", TINY_CONFIGS)
@pytest.mark.parametrize(("batch", "seq"), [(1, 64), (2, 100)])
def test_forward_flops_equal_transformers_on_cpu(name, batch, seq, tiny_models):
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    assert_equal_by_module(cpu_forward_flops(tiny_models[name], batch, seq), forward_flops(cfg, seq, batch), cfg)


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_decode_and_cached_prefill_equal_transformers(name, tiny_models):
    """A cached prefill of 70 and of 2 tokens (the conv's input padded to K by the cache), and a decode step after
    70 (the recurrent form: the conv update and the state read-out), counted."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    model = tiny_models[name]
    B, P = 2, 70
    ids = torch.randint(0, 97, (B, P + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for prompt in (2, P):
            with FlopCounterMode(display=False) as counter:
                cache = model(input_ids=ids[:, :prompt], use_cache=True).past_key_values
            assert counter.get_total_flops() == prefill_flops(cfg, prompt, B, prompt + 1).total
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids[:, P:], cache=cache, use_cache=True)
    assert counter.get_total_flops() == decode_flops(cfg, P, B, P + 1).total


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_training_flops_palm_still_equals_the_step(name):
    t = training_flops(config_from_hf(TINY_CONFIGS[name], name=name), 100, 2)
    assert t.palm == t.step


STATE_SHAPES = {  # (conv state, SSM state) per layer for B = 2, by hand from the tiny configs
    "tiny-mamba2": ((2, 8 * 8 + 2 * 2 * 16, 4), (2, 8, 8, 16)),  # (B, H·P + 2·G·N, K), (B, H, P, N)
    "tiny-mamba": ((2, 96, 4), (2, 96, 8)),  # (B, E, K), (B, E, N)
    "tiny-falcon-mamba": ((2, 96, 4), (2, 96, 12)),
    "tiny-jamba": ((2, 96, 4), (2, 96, 8)),  # and K, V on its 2 attention layers
}


@pytest.mark.parametrize("config", STATE_SHAPES)
@pytest.mark.parametrize(("dtype", "label"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_cache_equals_transformers_after_a_prefill(dtype, label, config):
    """Every layer's conv state in the model's dtype and SSM state in fp32: the bytes of transformers' cache."""
    cfg = config_from_hf(TINY_CONFIGS[config], name=config)
    model = cpu_model(TINY_CONFIGS[config]).to(dtype)
    held, shapes = hybrid_cache_after_prefill(model, 2, 70)
    conv, state = STATE_SHAPES[config]
    assert shapes == {(conv, dtype), (state, torch.float32)}
    assert held == kv_cache_bytes(cfg, 70, 2, label)


def test_jamba_v01_totals():
    """Jamba-v0.1's card: 52B parameters in total, 12B active (a token's router picks 2 of 16 experts in each of the
    16 MoE layers); by hand: 28 Mamba and 4 attention mixers, 16 dense and 16 MoE FFNs, two norms a layer."""
    cfg = config_from_hf(JAMBA_V01)
    d, e, n, r, f = 4096, 8192, 16, 256, 14336
    mamba = e * n + e + e * 4 + e + d * 2 * e + e * (r + 2 * n) + r * e + e + e * d + r + 2 * n
    attention = d * 32 * 128 + 2 * d * 8 * 128 + 32 * 128 * d
    dense, moe = 3 * d * f, 16 * d + 16 * 3 * d * f
    total = 2 * 65536 * d + 28 * mamba + 4 * attention + 16 * dense + 16 * moe + 32 * 2 * d + d
    assert parameter_breakdown(cfg).total == total == 51_570_323_328
    assert active_parameter_count(cfg) == total - 16 * 14 * 3 * d * f == 12_110_311_296
    assert f"{total / 1e9:.0f}B" == "52B" and f"{active_parameter_count(cfg) / 1e9:.0f}B" == "12B"


@pytest.mark.parametrize(
    ("name", "held"),
    [
        # 3 layers × batch 2 × (a bf16 conv state of 128 channels × 4 taps + an fp32 state of 8 heads × 8 × 16)
        ("tiny-mamba2", 3 * 2 * (128 * 4 * 2 + 8 * 8 * 16 * 4)),
        # 3 layers × batch 2 × (a bf16 conv state of E = 96 × 4 taps + an fp32 state of 96 × 8)
        ("tiny-mamba", 3 * 2 * (96 * 4 * 2 + 96 * 8 * 4)),
        # 4 Mamba layers as tiny-mamba's, and K and V of 2 KV heads × 12 on 2 attention layers for the cache's
        # C = P + G − 1 = 71 positions, bf16, batch 2
        ("tiny-jamba", 4 * 2 * (96 * 4 * 2 + 96 * 8 * 4) + 2 * 2 * (2 * 12) * 71 * 2 * 2),
    ],
)
def test_infer_gives_the_states(name, held, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_CONFIGS[name]))
    args = ("--prompt", "70", "--generate", "2", "--batch", "2", "--program", "generate", "--format", "json")
    r = run_cli("infer", path, *args)
    assert r.code == 0, r.err
    assert json.loads(r.out)["memory"]["kv_cache"] == held


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"head_dim": 16}, "hidden_size · expand = 64 · 1 must equal num_heads · head_dim = 8 · 16"),
        ({"use_bias": True}, "field 'use_bias' = True is not supported"),
        ({"use_conv_bias": False}, "field 'use_conv_bias' = False is not supported"),
        ({"n_groups": 3}, "mamba_heads=8 is not divisible by mamba_groups=3"),
        ({"state_size": 0}, "field 'state_size' must be between 1 and 10^18"),
        ({"model_type": "mamba", "use_bias": True}, "field 'use_bias' = True is not supported"),
        ({"model_type": "mamba", "hidden_act": "gelu"}, "field 'hidden_act' = 'gelu' is not supported"),
        ({"model_type": "falcon_mamba", "use_conv_bias": False}, "field 'use_conv_bias' = False is not supported"),
        ({"model_type": "mamba", "time_step_rank": "big"}, "field 'time_step_rank'"),
        ({"model_type": "jamba", "attn_layer_offset": 9}, "field 'attn_layer_offset' must be an integer in 0..2"),
        ({"model_type": "jamba", "expert_layer_offset": 0}, "expert_layer_offset = 0 with expert_layer_period = 2"),
        ({"model_type": "jamba", "mamba_proj_bias": True}, "field 'mamba_proj_bias' = True is not supported"),
    ],
)
def test_a_bad_config_is_one_line(change, message, run_cli, tmp_path):
    base = {"mamba2": TINY_MAMBA2, "mamba": TINY_MAMBA, "falcon_mamba": TINY_CONFIGS["tiny-falcon-mamba"]}
    base["jamba"] = TINY_CONFIGS["tiny-jamba"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base[change.get("model_type", "mamba2")], **change}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


BASE = dict(vocab_size=8, context_length=8, num_layers=3, d_model=16, num_heads=2, d_ff=16, positions="none")
SSM = dict(ssm_inner=32, ssm_state_size=4, ssm_dt_rank=2, ssm_conv_kernel=4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ssm_inner": 32}, "ssm_inner applies only to Mamba layers (an S in layer_pattern)"),
        ({"ssm_norms": "rmsnorm"}, "ssm_norms applies only to Mamba layers"),
        ({"layer_pattern": "S*-", **SSM, "ssm_norms": "layernorm"}, "ssm_norms must be one of none, weightless"),
        ({"layer_pattern": "S*-", "ssm_inner": 32}, "Mamba layers (S in layer_pattern) need ssm_state_size"),
        ({"layer_pattern": "S*-", **SSM, "ssm_dt_rank": 0}, "ssm_dt_rank must be positive"),
        ({"layer_pattern": "S*X", **SSM}, "M (Mamba2), S (Mamba), * (attention), - (MLP) or E"),
    ],
)
def test_a_bad_model_config_is_refused(fields, message):
    import re

    from lm_accounting.config import ConfigError, ModelConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelConfig(**BASE, **fields)


@pytest.mark.parametrize("name", ["tiny-mamba", "tiny-falcon-mamba", "tiny-jamba"])
def test_a_toml_model_is_the_config_json(name, tmp_path):
    """The same model from flat TOML keys (``layer_pattern`` and the ``ssm_*`` fields) as from its config.json."""
    from lm_accounting.config import load_config

    cfg = config_from_hf(TINY_CONFIGS[name], name="tiny")
    keys = ("layer_pattern", "mixer_ffn", "ssm_inner", "ssm_state_size", "ssm_dt_rank", "ssm_conv_kernel", "ssm_norms")
    keys += ("vocab_size", "context_length", "num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff")
    keys += ("positions", "mlp", "norm_eps", "tie_embeddings")
    keys += ("num_experts", "experts_per_token", "moe_every") if cfg.moe else ()
    text = "\n".join(f"{k} = {json.dumps(getattr(cfg, k))}" for k in keys if getattr(cfg, k) is not None)
    path = tmp_path / "tiny.toml"
    path.write_text(text + '\nname = "tiny"\n')
    assert load_config(path) == cfg
