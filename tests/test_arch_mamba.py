"""Pure state-space models (Mamba2, Mamba, Falcon-Mamba): parameters, forward FLOPs and the inference cache, exact
against transformers 5.24.

transformers' models/mamba2/modeling_mamba2.py: ``Mamba2ForCausalLM`` is ``backbone.embeddings``, one ``Mamba2Block``
per layer (``x + mixer(norm(x))``: an RMSNorm and a ``Mamba2Mixer``, the mixer of Nemotron-H's ``M`` layers: ``in_proj``
to z, x, B, C and dt, a depthwise causal conv1d with a bias over x, B, C, ``dt_bias``, ``A_log``, ``D``, the chunked
SSD scan ``mamba2_chunk_scan``, the gated RMSNorm per group, ``out_proj``), ``backbone.norm_f`` and ``lm_head`` (tied by
``tie_word_embeddings``).  lm-accounting reads it as a ``layer_pattern`` of ``M`` only (``hf_config._mamba2``).  models/mamba/modeling_mamba.py:
``MambaForCausalLM``, the same layout with a ``MambaMixer`` (``A_log`` E x N, ``D``, a depthwise conv1d with a bias
over x, ``in_proj`` to x and z, ``x_proj`` to dt's rank and B and C, ``dt_proj`` with a bias, applied as
``dt_proj.weight @``, the sequential selective scan ``mamba_selective_scan``, ``out_proj``), read as a pattern of
``S`` (``hf_config._mamba``); models/falcon_mamba: the same with weightless RMSNorms on dt, B and C
(``hf_config._falcon_mamba``).

Method (tests/test_arch_mamba2.py's): parameters by name on meta at full size; forward FLOPs with FlopCounterMode
module by module on meta at full size at 1,000 and 4,096 tokens, and on small real CPU tensors at 64 and 100 tokens
(chunks of 32: a multiple and not) with two sequences; a decode step, a cached prefill and the cache against the
cache transformers returns after a prefill, on CPU.

The full-size config: mistralai/Mamba-Codestral-7B-v0.1's config.json, written from memory (its sizes are
``Mamba2Config``'s defaults: hidden 4,096, 64 layers, 128 heads of 64, 8 groups of state 128, conv 4, chunks of 256,
vocabulary 32,768, untied); the card's 7,285,403,648 parameters (as remembered) is checked below.
state-spaces/mamba-130m-hf's config.json (from memory: hidden 768, 24 layers, state 16, dt rank 48, vocabulary
50,280, tied; "130m" checked) and tiiuae/falcon-mamba-7b's (from memory: hidden 4,096, 64 layers, expand 2, state 16,
dt rank 256, vocabulary 65,024, untied; the card's 7.27B checked).
"""

import json
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import forward_flops, training_flops
from lm_accounting.analytic.inference import decode_flops, prefill_flops
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import (
    assert_parameters_by_component,
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
CONFIGS = {"mamba-codestral-7b": CODESTRAL_MAMBA, "mamba-130m": MAMBA_130M, "falcon-mamba-7b": FALCON_MAMBA_7B}

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
}

MAMBA2_NAMES = ("in_proj", "conv1d", "conv1d.bias", "dt_bias", "A_log", "D", "norm", "out_proj")
MAMBA_NAMES = ("A_log", "D", "conv1d", "conv1d.bias", "in_proj", "x_proj", "dt_proj", "dt_proj.bias", "out_proj")
FALCON_NORMS = {"dt_layernorm": "dt_rms", "b_layernorm": "b_rms", "c_layernorm": "c_rms"}  # no parameter, no FLOP
LAYER_MAP = {"norm": ("ln1",), **{f"mixer.{n}": (f"mamba.{n}",) for n in MAMBA2_NAMES}}
SSM_MAP = {"norm": ("ln1",), **{f"mixer.{n}": (f"ssm.{n}",) for n in MAMBA_NAMES}}
SSM_MAP |= {f"mixer.{theirs}": (f"ssm.{ours}",) for theirs, ours in FALCON_NORMS.items()}
TOP = {"backbone.embeddings": "token_embeddings", "backbone.norm_f": "ln_final", "lm_head": "lm_head"}
PREFIX = "backbone.layers."
MAMBA2_KEYS = layer_keys(LAYER_MAP, TOP, PREFIX)
SSM_KEYS = layer_keys(SSM_MAP, TOP, PREFIX)
OWN = {  # the mixer's own FLOPs (its module less its children): functions and weights applied by hand, not modules
    "mamba2": ("layers.*.mamba.conv1d", "layers.*.mamba.core"),
    "ssm": ("layers.*.ssm.conv1d", "layers.*.ssm.dt_proj", "layers.*.ssm.core"),
}


def keys_of(cfg):
    return SSM_KEYS if cfg.ssm_layers else MAMBA2_KEYS


def assert_equal_by_module(counted: dict[str, int], fwd, cfg) -> None:
    """The total, every mapped module, and the mixer's own FLOPs (its module less its children) equal to ours for
    the conv and the scan (functions, not modules) and Mamba's ``dt_proj.weight @`` (``OWN``)."""
    our_keys, mixer = keys_of(cfg), set(OWN["ssm" if cfg.ssm_layers else "mamba2"])
    layer_map = SSM_MAP if cfg.ssm_layers else LAYER_MAP
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    own = 0
    for module, flops in counted.items():
        if module in TOP:
            by_keys[our_keys(module)] += flops
        elif module.startswith(PREFIX) and module.endswith(".mixer"):
            own += flops - sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == 4)
        elif module.startswith(PREFIX) and module[len(PREFIX) :].partition(".")[2] in layer_map:
            by_keys[our_keys(module)] += flops
    assert {k for keys in by_keys for k in keys if by_keys[keys]} == {it.key for it in fwd} - mixer
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total if k in fwd else 0 for k in keys) == flops, (keys, flops)
    assert own == sum(fwd[k].total for k in mixer)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


@pytest.fixture(scope="module")
def tiny_models():
    return {name: cpu_model(values) for name, values in TINY_CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    bd = parameter_breakdown(cfg)
    assert bd.total == sum(p.numel() for p in models[name].parameters())
    assert_parameters_by_component(bd, models[name], keys_of(cfg), with_empty=False)


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_tiny_parameters_equal_transformers(name, tiny_models):
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    bd = parameter_breakdown(cfg)
    assert bd.total == sum(p.numel() for p in tiny_models[name].parameters())
    assert_parameters_by_component(bd, tiny_models[name], keys_of(cfg), with_empty=False)


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


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1000, 4096])
def test_forward_flops_equal_transformers_on_meta(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    assert_equal_by_module(hf_forward_flops(models[name], seq), forward_flops(cfg, seq), cfg)


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


def test_infer_gives_the_states(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_MAMBA2))
    args = ("--prompt", "70", "--generate", "2", "--batch", "2", "--program", "generate", "--format", "json")
    r = run_cli("infer", path, *args)
    assert r.code == 0, r.err
    # 3 layers × batch 2 × (a bf16 conv state of 128 channels × 4 taps + an fp32 state of 8 heads × 8 × 16)
    assert json.loads(r.out)["memory"]["kv_cache"] == 3 * 2 * (128 * 4 * 2 + 8 * 8 * 16 * 4) == 30_720


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"head_dim": 16}, "hidden_size · expand = 64 · 1 must equal num_heads · head_dim = 8 · 16"),
        ({"use_bias": True}, "field 'use_bias' = True is not supported"),
        ({"use_conv_bias": False}, "field 'use_conv_bias' = False is not supported"),
        ({"n_groups": 3}, "mamba_heads=8 is not divisible by mamba_groups=3"),
        ({"state_size": 0}, "field 'state_size' must be between 1 and 10^18"),
    ],
)
def test_a_bad_config_is_one_line(change, message, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_MAMBA2, **change}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err
