"""ReLU-family MLPs (``mlp = relu``, ``relu2``): OPT and Nemotron, exact against transformers 5.24.

OPT (transformers' models/opt/modeling_opt.py, ``OPTDecoderLayer``): pre-LayerNorm blocks, q/k/v/out_proj and
``fc1``/``fc2`` with biases (``enable_bias``), ``proj(ReLU(fc x))``, learned positions in a table of
``max_position_embeddings + 2`` rows (``OPTLearnedPositionalEmbedding``'s offset), a final LayerNorm, a tied head.
Nemotron (models/nemotron/modeling_nemotron.py): Llama's block with ``NemotronLayerNorm1P`` (a LayerNorm's gain
and bias, applied as ``1 + w``), ``down_proj(ReLU(up_proj x)²)`` (``ReLUSquaredActivation``), RoPE on the first
half of each head (``partial_rotary_factor`` 0.5), no biases by default.

Method as tests/test_transformers_truth.py: transformers' model on meta, eager attention, parameters by name
(tests/hf_components.py), FlopCounterMode at two lengths, component by component; facebook/opt-125m's
config.json is written out below (offline machine) and its total is computed by hand.  Our live model runs both
MLPs (crosscheck on meta and cpu) and the course program replays them byte for byte against its storage tracker.
Known limit: OPT's table has max_position_embeddings + 2 rows and ``position_rows`` is that, so a context of
max_position_embeddings + 1 or + 2 tokens is accepted though transformers' OPT runs only max_position_embeddings.
"""

import json

import pytest

from lm_accounting.analytic.flops import forward_flops, nonmatmul_flops
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig, load_config
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
OPT_125M = {  # facebook/opt-125m/config.json
    "_name_or_path": "facebook/opt-125m",
    "_remove_final_layer_norm": False,
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
SMALL_OPT = {
    "model_type": "opt",
    "vocab_size": 256,
    "hidden_size": 64,
    "ffn_dim": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    **NO_IDS,
}
SMALL_NEMOTRON = {
    "model_type": "nemotron",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    **NO_IDS,
}
CONFIGS = {
    "opt-125m": {**OPT_125M, **NO_IDS},
    "opt-small": SMALL_OPT,
    "opt-no-bias-untied": {**SMALL_OPT, "enable_bias": False, "tie_word_embeddings": False},
    "opt-no-affine": {**SMALL_OPT, "layer_norm_elementwise_affine": False},
    "opt-gelu": {**SMALL_OPT, "activation_function": "gelu"},
    "nemotron-small": SMALL_NEMOTRON,
    "nemotron-biases-tied": {**SMALL_NEMOTRON, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "nemotron-quarter-rotary": {**SMALL_NEMOTRON, "partial_rotary_factor": 0.25, "head_dim": 32},
    "nemotron-relu": {**SMALL_NEMOTRON, "hidden_act": "relu"},
}
SEQS = (64, 256)

OPT_TOP = {
    "model.decoder.embed_tokens": "token_embeddings",
    "model.decoder.embed_positions": "position_embeddings",
    "model.decoder.final_layer_norm": "ln_final",
    "lm_head": "lm_head",
}
OPT_LAYER = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.out_proj": ("attn.output_proj",),
    "self_attn_layer_norm": ("ln1",),
    "fc1": ("ffn.fc",),
    "fc2": ("ffn.proj",),
    "final_layer_norm": ("ln2",),
}
NEMOTRON_TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
NEMOTRON_LAYER = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "mlp.up_proj": ("ffn.fc",),
    "mlp.down_proj": ("ffn.proj",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
}


def tables(name: str):
    """(top modules, layer modules, layer prefix) of the config's family."""
    if name.startswith("opt"):
        return OPT_TOP, OPT_LAYER, "model.decoder.layers."
    return NEMOTRON_TOP, NEMOTRON_LAYER, "model.layers."


def keys_of(name: str):
    top, layer, prefix = tables(name)

    def our_keys(hf_name: str) -> tuple[str, ...]:
        module, _, kind = hf_name.rpartition(".")
        if kind not in ("weight", "bias"):
            module, kind = hf_name, "weight"
        if module in top:
            return (top[module],)
        keys = layer[module[len(prefix) :].partition(".")[2]]
        bias = ".bias" if kind == "bias" and not keys[0].startswith("ln") else ""
        return tuple(f"layers.*.{k}{bias}" for k in keys)

    return our_keys


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(name, models):
    if name not in models:
        models[name] = build_hf(CONFIGS[name])
    return models[name]


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = model_of(name, models)
    assert_parameters_equal(cfg, model, keys_of(name), with_empty=False)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", SEQS)
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    counted = hf_forward_flops(model_of(name, models), seq)
    top, layer, prefix = tables(name)
    attention = "self_attn"
    assert_forward_flops_by_component(forward_flops(cfg, seq), counted, keys_of(name), top, layer, prefix, attention)


@pytest.mark.slow
def test_nemotron_at_the_class_defaults_equals_transformers(meta_masks):  # noqa: F811
    """``NemotronConfig()``'s defaults: the nemotron-15b shape (6,144 wide, 32 layers, 48 heads, 24,576 relu²)."""
    values = {"model_type": "nemotron", **NO_IDS}
    cls = transformers.CONFIG_MAPPING["nemotron"]()
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        values[key] = getattr(cls, key)
    values["max_position_embeddings"] = cls.max_position_embeddings
    values["num_key_value_heads"] = cls.num_attention_heads  # the class's None does not build (below)
    cfg = config_from_hf(values)
    model = build_hf(values)
    assert parameter_breakdown(cfg).total == sum(p.numel() for p in model.parameters())
    assert forward_flops(cfg.with_context(1024), 1024).total == hf_forward_flops(model, 1024)["total"]


def test_opt_125m_by_hand():
    """facebook/opt-125m: 125,239,296 (the count the OPT paper rounds to 125M): tied embeddings, a position table
    of 2,048 + 2 rows, 12 blocks of biased q/k/v/out, two LayerNorms and a biased ReLU MLP, the final LayerNorm."""
    V, d, L, F, P = 50272, 768, 12, 3072, 2048 + 2
    block = 4 * (d * d + d) + 2 * 2 * d + (d * F + F) + (F * d + d)
    assert V * d + P * d + L * block + 2 * d == 125_239_296
    cfg = config_from_hf(OPT_125M)
    assert parameter_breakdown(cfg).total == 125_239_296
    assert (cfg.position_rows, cfg.context_length, cfg.mlp, cfg.tie_embeddings) == (2050, 2048, "relu", True)
    assert {"dropout", "layerdrop", "init_std", "activation_dropout", "prefix"} <= set(cfg.ignored_fields)


def test_activation_conventions():
    """Non-matmul FLOPs: ReLU one compare per element, squared ReLU a compare and a square; no GELU, no gate."""
    S = 128
    opt = config_from_hf(SMALL_OPT).with_context(S)
    nem = config_from_hf(SMALL_NEMOTRON).with_context(S)
    nm_opt, nm_nem = nonmatmul_flops(opt, S), nonmatmul_flops(nem, S)
    assert nm_opt["layers.*.ffn.relu"].per_layer == S * 96
    assert nm_nem["layers.*.ffn.relu2"].per_layer == 2 * S * 96
    for nm in (nm_opt, nm_nem):
        assert not {"layers.*.ffn.gelu", "layers.*.ffn.silu", "layers.*.ffn.gate"} & set(nm.totals())
    assert "layers.*.ffn.relu2" not in nm_opt.totals() and "layers.*.ffn.relu" not in nm_nem.totals()
    assert nm_opt["position_embeddings"].total == S * 64 and "layers.*.attn.rope" in nm_nem.totals()
    assert (opt.family, nem.family) == ("OPT-style (ReLU MLP)", "Nemotron-style (squared-ReLU MLP)")
    assert (opt.architecture, nem.architecture) == (
        "pre-LayerNorm · ReLU MLP · learned positions · biases qkv/out/mlp",
        "pre-LayerNorm · squared-ReLU MLP · RoPE (first 8 of 16)",
    )


def test_readers_map_the_options():
    nem = config_from_hf({**SMALL_NEMOTRON, "norm_eps": 1e-6, "partial_rotary_factor": 1.0})
    assert (nem.norm, nem.norm_eps, nem.rotary_dim, nem.qkv_bias, nem.mlp_bias) == (
        "layernorm",
        1e-6,
        None,
        False,
        False,
    )
    assert config_from_hf({**SMALL_NEMOTRON, "hidden_act": "gelu_pytorch_tanh"}).hf_activation == "gelu_pytorch_tanh"
    opt = config_from_hf({**SMALL_OPT, "layer_norm_elementwise_affine": False, "enable_bias": False})
    assert (opt.norm_weights, opt.qkv_bias, opt.output_bias, opt.mlp_bias) == (False, False, False, False)
    assert config_from_hf({**SMALL_OPT, "word_embed_proj_dim": 64}).d_model == 64  # equal to hidden_size: read


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({**SMALL_OPT, "do_layer_norm_before": False}, "field 'do_layer_norm_before' = False is not supported"),
        ({**SMALL_OPT, "word_embed_proj_dim": 32}, "field 'word_embed_proj_dim' = 32 is not supported"),
        ({**SMALL_OPT, "_remove_final_layer_norm": True}, "field '_remove_final_layer_norm' = True is not supported"),
        ({**SMALL_OPT, "activation_function": "silu"}, "field 'activation_function' = 'silu' is not supported"),
        ({**SMALL_NEMOTRON, "hidden_act": "xielu"}, "field 'hidden_act' = 'xielu' is not supported"),
        ({**SMALL_NEMOTRON, "partial_rotary_factor": 1.5}, "field 'partial_rotary_factor' must be a number in"),
        ({k: v for k, v in SMALL_OPT.items() if k != "ffn_dim"}, "missing required field 'ffn_dim'"),
    ],
)
def test_what_the_readers_cannot_express_is_refused(values, message, run_cli, tmp_path):
    with pytest.raises(ConfigError, match=message):
        config_from_hf(values)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_nemotron_without_kv_heads_is_refused_as_transformers_cannot_build_it():
    values = {k: v for k, v in SMALL_NEMOTRON.items() if k != "num_key_value_heads"}
    with pytest.raises(ConfigError, match="field 'num_key_value_heads' is required for nemotron"):
        config_from_hf(values)
    with pytest.raises(TypeError):
        build_hf(values)


def test_opt_350m_post_norm_is_refused_and_transformers_does_build_it():
    """OPT-350m (post-norm, 512-wide embeddings projected in and out) builds in transformers; we refuse it by name."""
    values = {**SMALL_OPT, "do_layer_norm_before": False, "word_embed_proj_dim": 32}
    assert sum(p.numel() for p in build_hf(values).parameters()) > 0
    with pytest.raises(ConfigError, match="post-norm"):
        config_from_hf(values)


def test_toml_round_trip_and_bad_mlp(tmp_path):
    with pytest.raises(ConfigError, match="mlp must be one of swiglu, geglu, gelu, relu, relu2"):
        ModelConfig(**TINY, mlp="relu3")
    for mlp in ("relu", "relu2"):
        cfg = ModelConfig(**TINY, num_kv_heads=4, head_dim=8, mlp=mlp, norm="layernorm", mlp_bias=True, name="t")
        path = tmp_path / f"{mlp}.toml"
        keys = {k: v for k, v in cfg.resolved().items() if v is not None and k != "ignored_fields"}
        path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items()) + "\n")
        assert load_config(path) == cfg and cfg.resolved()["mlp"] == mlp
        assert f"{mlp} MLP" in cfg.unsupported_for_replay()


# -- the live model -------------------------------------------------------------------------------------
TINY = dict(vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=48)
LIVE = {
    "opt": dict(
        norm="layernorm",
        qkv_bias=True,
        output_bias=True,
        mlp_bias=True,
        mlp="relu",
        positions="learned",
        max_position_embeddings=66,
        tie_embeddings=True,
    ),
    "nemotron": dict(norm="layernorm", mlp="relu2", num_kv_heads=2, rotary_dim=4),
}
# test_ops_course.BASE has head_dim 10: rotary_dim 4 of 10 (partial), 6 KV-grouped heads over 2


@pytest.mark.parametrize("live", LIVE)
@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(live, device, seq):
    from lm_accounting.measure.crosscheck import crosscheck

    cfg = ModelConfig(**TINY, **LIVE[live], name=f"tiny-{live}")
    assert crosscheck(cfg, seq, 2, device=device, backward=True).mismatches() == []


def test_live_mlps_compute_transformers_activations():
    """On CPU: our ReLU and squared-ReLU MLPs equal ``fc2(ACT2FN["relu"](fc1 x))`` and Nemotron's
    ``down_proj(ReLUSquaredActivation(up_proj x))`` with the same weights."""
    from transformers.activations import ACT2FN

    from lm_accounting.model.layers import Relu2MLP, ReluMLP

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=gen)
    for cls, act in ((ReluMLP, "relu"), (Relu2MLP, "relu2")):
        torch.manual_seed(1)
        mlp = cls(8, 12, bias=True)
        fc, proj = torch.nn.Linear(8, 12), torch.nn.Linear(12, 8)
        with torch.no_grad():
            for ours, theirs in ((mlp.fc, fc), (mlp.proj, proj)):
                ours.bias.bias.normal_(generator=gen)  # our biases start at zero: make them count
                theirs.weight.copy_(ours.weight)
                theirs.bias.copy_(ours.bias.bias)
        torch.testing.assert_close(mlp(x), proj(ACT2FN[act](fc(x))))


@pytest.mark.parametrize("live", LIVE)
def test_course_program_equals_the_live_model(live):
    """The op library's program of our model (``analytic/ops/course``: ``relu`` saves its result, squared ReLU's
    pow saves its input, the same tensor) against the storage tracker on the live model, phase by phase, byte for
    byte: every checkpointing, precision and attention once, and amp-bf16 (the pow upcast to fp32), B = 1 to 3."""
    from test_ops_course import BASE, assert_same, sample

    from lm_accounting.analytic.ops import predict_step, unsupported
    from lm_accounting.measure.memory import measure_step
    from lm_accounting.setup import TrainingSetup

    options = {**LIVE[live], "max_position_embeddings": 20} if live == "opt" else LIVE[live]
    cfg = ModelConfig(**{**BASE, **options}, name=live)
    amp = [
        TrainingSetup(attention=a, checkpoint=c, precision="amp-bf16")
        for a in ("naive", "sdpa")
        for c in ("none", "full")
    ]
    for setup in [*sample(live), *amp]:
        assert unsupported(cfg, setup, "course") == []
        for batch in (1, 2, 3):
            predicted = predict_step(cfg, 8, setup, impl="course", batch=batch).at(batch)
            assert_same(measure_step(cfg, 8, batch, setup=setup), predicted, f"{live} {setup.label} B={batch}")


def test_memory_of_a_relu_config_json_predicts_its_step(run_cli, tmp_path):
    """OPT has a program (``ops.transformers.opt``, tests/test_ops_transformers_dense_zoo.py): opt-125m's step is
    predicted, its class's 0.1 dropout included."""
    path = tmp_path / "opt" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(OPT_125M))
    r = run_cli("account", path, "--format", "json", "--context", 1024)
    assert r.code == 0 and json.loads(r.out)["parameters"]["total"] == 125_239_296, r.err
    r = run_cli("memory", path, "--context", 1024)
    assert r.code == 0, r.err
    assert "OPTForCausalLM, training mode" in r.out and "model states only" not in r.out


def test_opt_runs_as_many_positions_as_its_config_names():
    """OPT's table has max_position_embeddings + 2 rows, looked up at position + 2: transformers' own model (CPU
    tensors, 8 positions) runs 8 tokens and fails on 9, and the context check agrees: 8 accepted, 9 and 10 refused
    (the table's 10 rows counted as positions, 9 and 10 were accepted)."""
    values = {**SMALL_OPT, "max_position_embeddings": 8}
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**values))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(IndexError):
        model(torch.zeros(1, 9, dtype=torch.long))
    cfg = config_from_hf(values)
    assert (cfg.position_rows, cfg.max_positions) == (10, 8)
    cfg.with_context(8)
    for seq in (9, 10):
        with pytest.raises(ConfigError, match="exceeds the 8 learned positions"):
            cfg.with_context(seq)
