"""gpt-oss (transformers' models/gpt_oss): attention sinks, a router with a bias, expert biases, the clamped
SwiGLU experts, Q/K/V/O biases and alternating sliding windows, exact against transformers 5.24.

The published config.json values of openai/gpt-oss-20b and openai/gpt-oss-120b are written out below (this
machine is offline).  They go two ways, as in tests/test_transformers_truth.py: ``hf_config.config_from_hf``
-> our analytic counts, and ``AutoModelForCausalLM.from_config(..., attn_implementation="eager",
experts_implementation="batched_mm")`` on meta -> ``parameters()`` by name and ``FlopCounterMode`` over one
forward of 1,024 and 4,096 tokens (both past the 128-token window).  Both models are built whole (24 and 36
layers) on meta.

Name map (transformers -> ours): ``self_attn.sinks`` -> ``attn.sinks``; ``mlp.router`` (weight, bias) ->
``moe.router`` and ``moe.router.bias``; ``mlp.experts.gate_up_proj`` (gate and up interleaved in one
(E, d, 2·d_e) tensor, ``GptOssExperts._apply_gate`` takes ``[..., ::2]`` and ``[..., 1::2]``) -> our W1 + W3,
``gate_up_proj_bias`` -> their biases; ``down_proj`` (and ``_bias``) -> W2 (and its bias).

FLOP convention for the sinks (docs/conventions.md): the sink is one more column of each softmax row, dropped
before AV, so it adds no matmul FLOP (FlopCounterMode agrees: the module's own FLOPs are exactly QKᵀ + AV)
and ``5·B·h·S`` non-matmul FLOPs per layer (``flops.sink_flops``).
"""

import dataclasses
import json

import pytest

from lm_accounting.analytic.flops import forward_flops, nonmatmul_flops
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig, load_config
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401


def layer_types(n: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


GPT_OSS = {  # openai/gpt-oss-20b/config.json; the 120b file differs in num_hidden_layers, num_local_experts
    "model_type": "gpt_oss",
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_key_value_heads": 8,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}
CONFIGS = {  # name -> (config.json, OpenAI's model card: total parameters, active without the embedding table)
    "gpt-oss-20b": (
        {**GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32, "layer_types": layer_types(24)},
        ("20.91B", "3.61B"),
    ),
    "gpt-oss-120b": (
        {**GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128, "layer_types": layer_types(36)},
        ("116.83B", "5.13B"),
    ),
}

# transformers' module path inside a layer -> our component keys (a fused tensor maps to several)
LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "self_attn.sinks": ("attn.sinks",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "mlp.router": ("moe.router",),
    "mlp.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),  # FLOPs: one module
    "mlp.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "mlp.experts.gate_up_proj_bias": ("moe.experts.w1.bias", "moe.experts.w3.bias"),
    "mlp.experts.down_proj": ("moe.experts.w2",),
    "mlp.experts.down_proj_bias": ("moe.experts.w2.bias",),
}
TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
PREFIX = "model.layers."


def our_keys(name: str) -> tuple[str, ...]:
    """Our keys for one of transformers' parameter names (or module paths, for FLOPs)."""
    if name.removesuffix(".weight") in TOP:
        return (TOP[name.removesuffix(".weight")],)
    assert name.startswith(PREFIX), name
    inner = name[len(PREFIX) :].partition(".")[2]
    if inner in LAYER_MAP:
        return tuple(f"layers.*.{k}" for k in LAYER_MAP[inner])
    module, _, kind = inner.rpartition(".")
    keys = LAYER_MAP[module]
    bias = ".bias" if kind == "bias" and not keys[0].startswith("ln") else ""
    return tuple(f"layers.*.{k}{bias}" for k in keys)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, (values, _) in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    values, (published, active) = CONFIGS[name]
    cfg = config_from_hf(values, name=name)
    model = models[name]
    bd = assert_parameters_equal(cfg, model, our_keys)
    # OpenAI's model card (gpt-oss-120b & gpt-oss-20b, 2025, table 1), to the digits published
    assert f"{bd.total / 1e9:.2f}B" == published
    embedding = cfg.vocab_size * cfg.d_model  # the card's active count leaves the embedding table out
    assert f"{(active_parameter_count(cfg) - embedding) / 1e9:.2f}B" == active


def test_parameters_by_hand():
    """gpt-oss-20b from the shapes in transformers' modeling_gpt_oss.py, written out."""
    V, d, L, E, f, h, kv, hd = 201088, 2880, 24, 32, 2880, 64, 8, 64
    attention = (d * h * hd + h * hd) + 2 * (d * kv * hd + kv * hd) + (h * hd * d + d) + h  # q, k, v, o, sinks
    router = E * d + E
    experts = E * d * 2 * f + E * 2 * f + E * f * d + E * d  # gate_up_proj (+ bias), down_proj (+ bias)
    total = 2 * V * d + L * (attention + 2 * d + router + experts) + d
    assert total == 20_914_757_184
    assert parameter_breakdown(config_from_hf(CONFIGS["gpt-oss-20b"][0])).total == total
    idle = (E - 4) * (3 * d * f + 2 * f + d)
    assert active_parameter_count(config_from_hf(CONFIGS["gpt-oss-20b"][0])) == total - L * idle


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 4096])
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    values = CONFIGS[name][0]
    cfg = config_from_hf(values, name=name).with_context(seq)
    counted = hf_forward_flops(models[name], seq)
    fwd = forward_flops(cfg, seq)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, PREFIX, "self_attn")


def test_forward_flops_by_hand():
    """gpt-oss-20b at T = 1,024 tokens: projections, full-square attention on every layer (the window is a mask),
    the router (its bias add is no matmul), k = 4 experts per token, the LM head."""
    T, V, d, L, E, f, h, kv, hd = 1024, 201088, 2880, 24, 32, 2880, 64, 8, 64
    projections = 2 * T * d * (h * hd + 2 * kv * hd) + 2 * T * h * hd * d
    attention = 2 * (2 * h * T * T * hd)
    experts = 2 * (T * 4) * d * 2 * f + 2 * (T * 4) * f * d
    total = L * (projections + attention + 2 * T * d * E + experts) + 2 * T * d * V
    assert forward_flops(config_from_hf(CONFIGS["gpt-oss-20b"][0]).with_context(T), T).total == total


def test_sink_and_expert_conventions():
    """The non-matmul convention (docs/conventions.md): a sink adds one softmax column per row, 5 FLOPs each;
    the clamped SwiGLU is 9 per element before the gating product; each bias is one add per output element."""
    cfg = config_from_hf(CONFIGS["gpt-oss-20b"][0]).with_context(256)
    S, h, k, d, f, E = 256, 64, 4, 2880, 2880, 32
    nm = nonmatmul_flops(cfg, S)
    assert nm["layers.*.attn.sinks"].per_layer == 5 * h * S
    assert nm["layers.*.moe.experts.silu"].per_layer == 9 * S * k * f
    assert nm["layers.*.moe.experts.w1.bias"].per_layer == S * k * f
    assert nm["layers.*.moe.experts.w2.bias"].per_layer == S * k * d
    assert nm["layers.*.moe.router.bias"].per_layer == S * E
    assert "layers.*.attn.sinks" not in forward_flops(cfg, S).totals()


def test_toml_keys_give_the_same_model(tmp_path):
    """The TOML path: the new keys (attention_sinks, router_bias, expert_bias, swiglu_limit)."""
    path = tmp_path / "oss.toml"
    path.write_text("""
vocab_size = 201088
context_length = 131072
num_layers = 24
d_model = 2880
num_heads = 64
num_kv_heads = 8
head_dim = 64
d_ff = 2880
rope_theta = 150000.0
qkv_bias = true
output_bias = true
expert_bias = true
attention_sinks = true
sliding_window = 128
full_attention_every = 2
num_experts = 32
experts_per_token = 4
router_bias = true
swiglu_limit = 7.0
hf_model_type = "gpt_oss"
""")
    ours = load_config(path)
    assert parameter_breakdown(ours).total == 20_914_757_184
    assert ours == config_from_hf(CONFIGS["gpt-oss-20b"][0], name=ours.name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"router_bias": True}, "router_bias applies only to a mixture of experts"),
        ({"swiglu_limit": 7.0}, "swiglu_limit applies only to a mixture of experts"),
        ({"num_experts": 4, "experts_per_token": 2, "swiglu_limit": -1.0}, "swiglu_limit must be a positive"),
        ({"expert_bias": True}, "expert_bias applies only to a mixture of experts"),
        ({"attention_sinks": 1}, "attention_sinks must be true or false"),
    ],
)
def test_inconsistent_options_are_one_line(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(vocab_size=10, context_length=8, num_layers=2, d_model=8, num_heads=2, d_ff=8, **change)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": layer_types(23)}, "lists 23 layers, num_hidden_layers is 24"),
        ({"swiglu_limit": "7"}, "swiglu_limit"),
        ({"num_local_experts": None}, "num_local_experts"),
        ({"layer_types": ["full_attention", "sliding_attention"] * 12}, "layer_types' is not understood"),
    ],
)
def test_bad_config_json_is_one_line(change, message, tmp_path, run_cli):
    path = tmp_path / "gpt-oss" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**CONFIGS["gpt-oss-20b"][0], **change}))
    with pytest.raises(ConfigError, match=message):
        config_from_hf({**CONFIGS["gpt-oss-20b"][0], **change})
    result = run_cli(str(path))
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err


# -- the live model (lm_accounting.model): the same pieces, cross-checked and run --------------------------
TINY_OSS = ModelConfig(
    vocab_size=97, context_length=64, num_layers=3, d_model=32, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=24,
    qkv_bias=True, output_bias=True, attention_sinks=True, sliding_window=8, full_attention_every=2, num_experts=4,
    experts_per_token=2, expert_bias=True, router_bias=True, swiglu_limit=7.0, name="tiny-gpt-oss",
)  # fmt: skip


@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(device, seq):
    """Parameters per component, forward matmul FLOPs (fvcore and FlopCounterMode) and a training step's FLOPs."""
    from lm_accounting.measure.crosscheck import crosscheck

    assert crosscheck(TINY_OSS, seq, 2, device=device, backward=True).mismatches() == []


def test_live_model_parameters_follow_the_registry():
    from lm_accounting.analytic.parallel import parameter_shapes
    from lm_accounting.model import build_model

    model = build_model(TINY_OSS)
    live = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert live == [(p.name, p.shape) for p in parameter_shapes(TINY_OSS)]
    assert ("layers.0.attn.sinks.weight", (4,)) in live and ("layers.0.moe.router.bias.bias", (4,)) in live
    assert ("layers.0.moe.experts.w2.bias.bias", (4, 32)) in live


def test_sinks_and_clamped_swiglu_compute_what_transformers_does():
    """On small CPU tensors: our ``Sinks`` softmax equals transformers' eager gpt-oss attention's probabilities
    (the sink column concatenated, softmaxed, dropped), and ``clamped_swiglu`` its ``GptOssExperts._apply_gate``
    (gate and up interleaved in one gate_up tensor)."""
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from lm_accounting.model.layers import Sinks
    from lm_accounting.model.moe import clamped_swiglu

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 4, 5, 5, generator=gen) * 4
    sinks = Sinks(4)
    with torch.no_grad():
        sinks.weight.copy_(torch.randn(4, generator=gen))
    combined = torch.cat([scores, sinks.weight.reshape(1, -1, 1, 1).expand(2, -1, 5, -1)], dim=-1)
    expected = torch.softmax(combined - combined.max(dim=-1, keepdim=True).values, dim=-1)[..., :-1]
    torch.testing.assert_close(sinks(scores), expected)
    assert not torch.allclose(sinks(scores).sum(-1), torch.ones(2, 4, 5))  # the sink takes some of the mass
    experts = GptOssExperts(GptOssConfig(hidden_size=8, intermediate_size=6, num_local_experts=2))
    gate_up = torch.randn(3, 12, generator=gen) * 6  # beyond the ±7 clamp too
    ours = clamped_swiglu(gate_up[..., ::2], gate_up[..., 1::2], 7.0)
    torch.testing.assert_close(ours, experts._apply_gate(gate_up))


def test_live_model_refuses_the_fused_kernel_with_sinks():
    from lm_accounting.config import AccountingError
    from lm_accounting.model import build_model
    from lm_accounting.setup import TrainingSetup

    cfg = dataclasses.replace(TINY_OSS, sliding_window=None, full_attention_every=None)
    with pytest.raises(AccountingError, match="attention sinks run with attention=naive only"):
        build_model(cfg, setup=TrainingSetup(attention="sdpa"))


def test_memory_replay_names_what_it_does_not_model(run_cli, tmp_path):
    """The course program (the step replay) does not transliterate the new pieces: model states only, named."""
    path = tmp_path / "gpt-oss-20b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS["gpt-oss-20b"][0]))
    result = run_cli("memory", path, "--impl", "course", "-S", "256")
    assert result.code == 0, result.err
    assert "model states only" in result.out and "attention sinks, expert biases, router bias" in result.out


@pytest.mark.parametrize("name", CONFIGS)
def test_presets_are_their_config_json(name):
    """The presets say what the config.json says (every field but the name and the ignored list)."""
    from_json = config_from_hf(CONFIGS[name][0], name=name).resolved()
    assert {**from_json, "ignored_fields": []} == load_config(name).resolved()
    assert load_config(name).hf_model_type == "gpt_oss"


def test_reading_a_gpt_oss_config_imports_no_torch(tmp_path):
    """The analytic answer for gpt-oss's config.json, in a fresh process: no torch, no transformers."""
    import subprocess
    import sys

    path = tmp_path / "my-oss" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS["gpt-oss-120b"][0]))
    code = (
        "import sys\n"
        "from lm_accounting import load_config, account\n"
        f"a = account(load_config({str(path)!r}), seq=4096)\n"
        "print(a.params.total, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    assert run.stdout.split() == ["116829156672", "False", "False"]
