"""Parallel attention + MLP blocks (``parallel_block``), exact against transformers 5.24.

``x + attn(norm(x)) + mlp(norm(x))``: one norm feeding both sublayers (``one_norm``: Cohere's
``CohereDecoderLayer``, Phi's ``PhiDecoderLayer``, GPT-J's ``GPTJBlock``, StableLM with
``use_parallel_residual``), or two (``two_norms``: ``GPTNeoXLayer`` with ``use_parallel_residual``, ``mlp(
post_attention_layernorm(x))``).  The matmuls are a pre-norm block's; ``one_norm`` has one norm fewer.  Cohere's
``CohereLayerNorm`` has a gain and no bias (``norm_bias = false``).

The config.json values below have the shapes of the published models (CohereForAI/c4ai-command-r-v01,
CohereForAI/c4ai-command-r7b-12-2024, microsoft/phi-2, EleutherAI/pythia-160m, EleutherAI/gpt-j-6b), written
out on an offline machine from their model cards: every exactness test builds transformers' model from the same
values, so none depends on them being the hub's byte for byte; the two published totals (Pythia's table, phi-2)
are a separate check.  Method as tests/test_transformers_truth.py: transformers' model on meta, eager
attention, parameters by name, FlopCounterMode at 1,024 and 2,048 tokens.

Memory: transformers' Cohere, Cohere2, GPT-NeoX, Phi and GPT-J have programs in the op library
(``analytic/ops/transformers/``: ``cohere.py``, ``gpt_neox.py``, ``phi.py``, ``gptj.py``), their steps equal to the
real models' measured on meta (tests/test_ops_transformers_parallel.py); Falcon's program
(``falcon.py``) is proven in tests/test_ops_transformers_dense_zoo.py.
Our own model of each (``--impl course``) is replayed by the course program, parallel block included
(``test_course_program_equals_the_live_model``), except its q/k norms of LayerNorm kind or with per-head gains.
"""

import dataclasses
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

COMMAND_R = {  # CohereForAI/c4ai-command-r-v01
    "model_type": "cohere",
    "architectures": ["CohereForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 5,
    "eos_token_id": 255001,
    "hidden_act": "silu",
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "intermediate_size": 22528,
    "layer_norm_eps": 1e-05,
    "logit_scale": 0.0625,
    "max_position_embeddings": 8192,
    "num_attention_heads": 64,
    "num_hidden_layers": 40,
    "num_key_value_heads": 64,
    "pad_token_id": 0,
    "rope_theta": 8000000.0,
    "torch_dtype": "float16",
    "use_cache": True,
    "use_qk_norm": False,
    "vocab_size": 256000,
}
COMMAND_R_PLUS = {  # CohereForAI/c4ai-command-r-plus: Q and K normed per head, a gain per head (use_qk_norm)
    **COMMAND_R,
    "hidden_size": 12288,
    "intermediate_size": 33792,
    "logit_scale": 0.8333333333333334,
    "num_attention_heads": 96,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rope_theta": 75000000.0,
    "use_qk_norm": True,
}
COMMAND_R7B = {  # CohereForAI/c4ai-command-r7b-12-2024: windows of 4,096 on 3 layers in 4
    "model_type": "cohere2",
    "architectures": ["Cohere2ForCausalLM"],
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "layer_norm_eps": 1e-05,
    "logit_scale": 0.25,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 50000,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "vocab_size": 256000,
}
PHI_2 = {  # microsoft/phi-2
    "model_type": "phi",
    "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0,
    "embd_pdrop": 0.0,
    "hidden_act": "gelu_new",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4,
    "qk_layernorm": False,
    "resid_pdrop": 0.1,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "vocab_size": 51200,
}
PYTHIA_160M = {  # EleutherAI/pythia-160m
    "model_type": "gpt_neox",
    "architectures": ["GPTNeoXForCausalLM"],
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "gelu",
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_parallel_residual": True,
    "vocab_size": 50304,
}
GPT_J_6B = {  # EleutherAI/gpt-j-6b
    "model_type": "gptj",
    "architectures": ["GPTJForCausalLM"],
    "activation_function": "gelu_new",
    "attn_pdrop": 0.0,
    "bos_token_id": 50256,
    "embd_pdrop": 0.0,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "n_embd": 4096,
    "n_head": 16,
    "n_inner": None,
    "n_layer": 28,
    "n_positions": 2048,
    "resid_pdrop": 0.0,
    "rotary_dim": 64,
    "tie_word_embeddings": False,
    "vocab_size": 50400,
}
FALCON_7B = {  # tiiuae/falcon-7b: one K/V head (multi_query), attention and the MLP from one LayerNorm
    "model_type": "falcon",
    "architectures": ["FalconForCausalLM"],
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0,
    "bias": False,
    "bos_token_id": 11,
    "eos_token_id": 11,
    "hidden_dropout": 0.0,
    "hidden_size": 4544,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 65024,
}
FALCON_40B = {  # tiiuae/falcon-40b: the new decoder architecture, 8 K/V heads, ln_attn and ln_mlp
    **{k: v for k, v in FALCON_7B.items() if k not in ("multi_query", "new_decoder_architecture")},
    "hidden_size": 8192,
    "new_decoder_architecture": True,
    "num_attention_heads": 128,
    "num_hidden_layers": 60,
    "num_kv_heads": 8,
}
STABLELM_PARALLEL = {  # a small StableLM with use_parallel_residual (input_layernorm alone)
    "model_type": "stablelm",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "use_qkv_bias": True,
    "use_parallel_residual": True,
}
CONFIGS = {
    "command-r": COMMAND_R,
    "command-r-plus": COMMAND_R_PLUS,
    "command-r7b": COMMAND_R7B,
    "command-r7b-small": {  # Command R7B's block at small widths, the window (128) shorter than both lengths
        **COMMAND_R7B,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "vocab_size": 1000,
        "sliding_window": 128,
    },
    "phi-2": PHI_2,
    "phi-qk-layernorm": {
        **PHI_2,
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "num_hidden_layers": 3,
        "qk_layernorm": True,
    },
    "pythia-160m": PYTHIA_160M,
    "pythia-160m-sequential": {**PYTHIA_160M, "use_parallel_residual": False, "attention_bias": False},
    "gpt-j-6b": GPT_J_6B,
    "gpt-j-small-inner": {**GPT_J_6B, "n_embd": 512, "n_layer": 3, "n_inner": 1000, "rotary_dim": 16},
    "stablelm-parallel": STABLELM_PARALLEL,
    "falcon-7b": FALCON_7B,
    "falcon-40b": FALCON_40B,
    "falcon-new-one-norm": {**FALCON_40B, "num_hidden_layers": 3, "num_ln_in_parallel_attn": 1, "bias": True},
    "falcon-sequential": {**FALCON_7B, "num_hidden_layers": 3, "parallel_attn": False, "multi_query": False},
    "falcon-sequential-mq": {**FALCON_7B, "num_hidden_layers": 3, "parallel_attn": False, "ffn_hidden_size": 9000},
}
PUBLISHED = {"pythia-160m": 162_322_944, "phi-2": 2_779_683_840}
"""Total parameters: Pythia's table (EleutherAI/pythia README, "Total Params"), phi-2's model card."""

# transformers' module names -> our component keys, per family
LLAMA_LIKE = {
    "self_attn.q_norm": ("attn.q_norm",),
    "self_attn.k_norm": ("attn.k_norm",),
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "mlp.gate_proj": ("ffn.w1",),
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
    "input_layernorm": ("ln1",),
}
MAPS = {  # model_type -> (layer prefix, the attention module, its layer map, the modules outside the blocks)
    "cohere": ("model.layers.", "self_attn", LLAMA_LIKE, {"model.embed_tokens": "token_embeddings"}),
    "stablelm": ("model.layers.", "self_attn", LLAMA_LIKE, {"model.embed_tokens": "token_embeddings"}),
    "phi": (
        "model.layers.",
        "self_attn",
        {
            **{k: v for k, v in LLAMA_LIKE.items() if k.startswith(("self_attn.q", "self_attn.k", "self_attn.v"))},
            "self_attn.dense": ("attn.output_proj",),
            "self_attn.q_layernorm": ("attn.q_norm",),
            "self_attn.k_layernorm": ("attn.k_norm",),
            "mlp.fc1": ("ffn.fc",),
            "mlp.fc2": ("ffn.proj",),
            "input_layernorm": ("ln1",),
        },
        {"model.embed_tokens": "token_embeddings", "model.final_layernorm": "ln_final"},
    ),
    "gpt_neox": (
        "gpt_neox.layers.",
        "attention",
        {
            "input_layernorm": ("ln1",),
            "post_attention_layernorm": ("ln2",),
            "attention.query_key_value": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
            "attention.dense": ("attn.output_proj",),
            "mlp.dense_h_to_4h": ("ffn.fc",),
            "mlp.dense_4h_to_h": ("ffn.proj",),
        },
        {"gpt_neox.embed_in": "token_embeddings", "gpt_neox.final_layer_norm": "ln_final"},
    ),
    "falcon": (
        "transformer.h.",
        "self_attention",
        {
            "input_layernorm": ("ln1",),
            "ln_attn": ("ln1",),
            "ln_mlp": ("ln2",),
            "post_attention_layernorm": ("ln2",),
            "self_attention.query_key_value": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
            "self_attention.dense": ("attn.output_proj",),
            "mlp.dense_h_to_4h": ("ffn.fc",),
            "mlp.dense_4h_to_h": ("ffn.proj",),
        },
        {"transformer.word_embeddings": "token_embeddings", "transformer.ln_f": "ln_final"},
    ),
    "gptj": (
        "transformer.h.",
        "attn",
        {
            "ln_1": ("ln1",),
            "attn.q_proj": ("attn.q_proj",),
            "attn.k_proj": ("attn.k_proj",),
            "attn.v_proj": ("attn.v_proj",),
            "attn.out_proj": ("attn.output_proj",),
            "mlp.fc_in": ("ffn.fc",),
            "mlp.fc_out": ("ffn.proj",),
        },
        {"transformer.wte": "token_embeddings", "transformer.ln_f": "ln_final"},
    ),
}
MAPS["cohere2"] = MAPS["cohere"]


def family(name: str):
    prefix, attention, layer_map, top = MAPS[CONFIGS[name]["model_type"]]
    top = {"model.norm": "ln_final", "lm_head": "lm_head", **top}
    return prefix, attention, layer_map, top


def keys_of(name: str):
    """``our_keys`` for ``hf_components``: a parameter or module name -> our component keys."""
    prefix, _, layer_map, top = family(name)

    def our_keys(hf_name: str) -> tuple[str, ...]:
        module, _, kind = hf_name.rpartition(".")
        if kind not in ("weight", "bias"):  # a module's name (FLOPs), not a parameter's
            module, kind = hf_name, "weight"
        if module in top:
            return (top[module] + (".bias" if kind == "bias" and top[module] == "lm_head" else ""),)
        keys = layer_map[module[len(prefix) :].partition(".")[2]]
        bias = ".bias" if kind == "bias" and not keys[0].startswith("ln") and not keys[0].endswith("_norm") else ""
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
    bd = assert_parameters_equal(cfg, model, keys_of(name), with_empty=False)
    assert bd.total == PUBLISHED.get(name, bd.total)
    one_norm = cfg.parallel_block == "one_norm"
    assert ("layers.*.ln2" in bd.totals()) == (not one_norm)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 2048])
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    counted = hf_forward_flops(model_of(name, models), seq)
    fwd = forward_flops(cfg, seq)
    prefix, attention, layer_map, top = family(name)
    assert_forward_flops_by_component(fwd, counted, keys_of(name), top, layer_map, prefix, attention)


def test_parameters_by_hand():
    """Command R (tied): 40 blocks of 4·d² attention, a 3·d·d_ff SwiGLU and one bias-free LayerNorm (d), the
    final one (d), the embedding.  Pythia-160M: 12 blocks of two LayerNorms (4·d), the fused Q/K/V (3·d² + 3·d),
    dense (d² + d) and the MLP (8·d² + 5·d), the final LayerNorm, untied embeddings."""
    V, d, f, L = 256000, 8192, 22528, 40
    assert parameter_breakdown(config_from_hf(COMMAND_R)).total == L * (4 * d * d + 3 * d * f + d) + d + V * d
    V, d, L = 50304, 768, 12
    block = 4 * d + 3 * d * d + 3 * d + d * d + d + 8 * d * d + 5 * d
    assert parameter_breakdown(config_from_hf(PYTHIA_160M)).total == L * block + 2 * d + 2 * V * d
    # Falcon-7B (tied): one LayerNorm (2·d), Q plus one K/V head of 64 (d·(d + 128)), dense d², a 4·d MLP
    V, d, L = 65024, 4544, 32
    block = 2 * d + d * (d + 128) + d * d + 8 * d * d
    assert parameter_breakdown(config_from_hf(FALCON_7B)).total == L * block + 2 * d + V * d == 6_921_720_704


def test_the_one_norm_block_has_one_norm_fewer():
    """Phi-2 read as a sequential block (the same options but parallel_block = none) has one LayerNorm (2·d) more
    per layer and the same matmul FLOPs; its non-matmul FLOPs differ by that norm (7·T·d) only."""
    S = 512
    cfg = config_from_hf(PHI_2).with_context(S)
    sequential = dataclasses.replace(cfg, parallel_block="none")
    d, L = 2560, 32
    assert parameter_breakdown(sequential).total - parameter_breakdown(cfg).total == L * 2 * d
    assert forward_flops(sequential, S).total == forward_flops(cfg, S).total
    assert nonmatmul_flops(sequential, S).total - nonmatmul_flops(cfg, S).total == L * 7 * S * d


def test_norm_without_bias_convention():
    """Cohere's LayerNorm: d parameters (gain), 6 non-matmul FLOPs per element (7 less the bias add)."""
    S = 256
    cfg = config_from_hf(COMMAND_R).with_context(S)
    nm = nonmatmul_flops(cfg, S)
    assert nm["layers.*.ln1"].per_layer == 6 * S * 8192 and nm["ln_final"].total == 6 * S * 8192
    assert parameter_breakdown(cfg)["layers.*.ln1"].per_layer == 8192
    assert "parallel attention + MLP (one norm)" in cfg.architecture and "(no bias)" in cfg.architecture
    assert cfg.family.startswith("parallel block")


def test_readers_map_the_options():
    neox = config_from_hf(PYTHIA_160M)
    assert (neox.parallel_block, neox.rotary_dim, neox.qkv_bias, neox.output_bias) == ("two_norms", 16, True, True)
    sequential = config_from_hf(CONFIGS["pythia-160m-sequential"])
    assert (sequential.parallel_block, sequential.qkv_bias) == ("none", False)
    gptj = config_from_hf(GPT_J_6B)
    assert (gptj.parallel_block, gptj.rotary_dim, gptj.d_ff, gptj.lm_head_bias) == ("one_norm", 64, 16384, True)
    assert gptj.rope_interleave and not gptj.qkv_bias and gptj.mlp_bias
    phi = config_from_hf(PHI_2)
    assert (phi.rotary_dim, phi.mlp, phi.lm_head_bias, phi.parallel_block) == (32, "gelu", True, "one_norm")
    r7b = config_from_hf(COMMAND_R7B)
    assert (r7b.sliding_window, r7b.full_attention_every, r7b.norm_bias, r7b.tie_embeddings) == (4096, 4, False, True)
    assert "logit_scale" not in config_from_hf(COMMAND_R).ignored_fields  # read: a constant on the logits
    falcon = config_from_hf(FALCON_7B)  # FalconConfig's multi_query (true) gives one K/V head, whatever num_kv_heads
    assert (falcon.kv_heads, falcon.parallel_block, falcon.d_ff) == (1, "one_norm", 4 * 4544)
    assert config_from_hf({**FALCON_7B, "num_kv_heads": 71}).kv_heads == 1  # save_pretrained writes num_kv_heads
    assert (config_from_hf(FALCON_40B).kv_heads, config_from_hf(FALCON_40B).parallel_block) == (8, "two_norms")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({**GPT_J_6B, "rotary_dim": None}, "field 'rotary_dim' = null is not supported"),
        ({**GPT_J_6B, "rotary_dim": 512}, "field 'rotary_dim' = 512 exceeds the head size 256"),
        ({**PYTHIA_160M, "hidden_act": "relu"}, "field 'hidden_act' = 'relu' is not supported: a GELU MLP"),
        ({**FALCON_7B, "alibi": True}, "field 'alibi' = True is not supported"),
        ({**FALCON_40B, "parallel_attn": False}, "field 'parallel_attn' = false is not supported"),
        ({**FALCON_7B, "num_ln_in_parallel_attn": 2}, "field 'num_ln_in_parallel_attn' = 2 is not supported"),
        ({**FALCON_7B, "multi_query": False, "num_kv_heads": 1}, "field 'num_kv_heads' must be"),
    ],
)
def test_what_the_readers_cannot_express_is_refused(values, message, run_cli, tmp_path):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_hf(values)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parallel_block": "three_norms"}, "parallel_block must be one of none, one_norm, two_norms"),
        ({"parallel_block": "one_norm", "norm_placement": "sandwich"}, "it needs norm_placement = pre"),
        ({"norm_bias": False}, "norm_bias = false applies only to a LayerNorm with weights"),
        ({"norm_bias": False, "norm": "layernorm", "norm_weights": False}, "norm_bias = false applies only"),
    ],
)
def test_bad_options_are_one_line_exit_2(change, message, run_cli, tmp_path):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**TINY, **change)
    lines = [f"{k} = {json.dumps(v)}" for k, v in {**TINY, **change}.items()]
    path = tmp_path / "model.toml"
    path.write_text("\n".join(lines) + "\n")
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_toml_round_trip(tmp_path):
    """The options as TOML keys, read back equal; the JSON of the account carries them; a non-bool is refused."""
    with pytest.raises(ConfigError, match="norm_bias must be true or false"):
        ModelConfig(**TINY, norm="layernorm", norm_bias=0)
    cfg = ModelConfig(
        **TINY, num_kv_heads=4, head_dim=8, norm="layernorm", norm_bias=False, parallel_block="two_norms", name="t"
    )
    path = tmp_path / "t.toml"
    keys = {k: v for k, v in cfg.resolved().items() if v is not None and k != "ignored_fields"}
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items()) + "\n")
    assert load_config(path) == cfg
    assert (cfg.resolved()["parallel_block"], cfg.resolved()["norm_bias"]) == ("two_norms", False)


# -- the live model -------------------------------------------------------------------------------------
TINY = dict(vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=48)
LIVE = {
    "cohere": dict(norm="layernorm", norm_bias=False, parallel_block="one_norm", tie_embeddings=True),
    "phi": dict(
        norm="layernorm",
        parallel_block="one_norm",
        qkv_bias=True,
        output_bias=True,
        mlp="gelu",
        mlp_bias=True,
        lm_head_bias=True,
        rotary_dim=4,
    ),
    "gpt_neox": dict(
        norm="layernorm",
        parallel_block="two_norms",
        qkv_bias=True,
        output_bias=True,
        mlp="gelu",
        mlp_bias=True,
        rotary_dim=2,
    ),
    "rmsnorm-two": dict(parallel_block="two_norms"),
    "rmsnorm-one": dict(parallel_block="one_norm", num_kv_heads=2),
    "cohere-qk": dict(
        norm="layernorm",
        norm_bias=False,
        parallel_block="one_norm",
        qk_norm=True,
        qk_norm_scope="head_weights",
        num_kv_heads=2,
    ),
    "phi-qk": dict(norm="layernorm", parallel_block="one_norm", qk_norm=True, num_kv_heads=2),
    "rmsnorm-qk-gains": dict(qk_norm=True, qk_norm_scope="head_weights", num_kv_heads=2),
}  # fmt: skip
PROGRAMMED = ["cohere", "phi", "gpt_neox", "rmsnorm-two", "rmsnorm-one"]  # the course program's; not the q/k norms


@pytest.mark.parametrize("live", LIVE)
@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(live, device, seq):
    from lm_accounting.measure.crosscheck import crosscheck

    cfg = ModelConfig(**TINY, **LIVE[live], name=f"tiny-{live}")
    assert crosscheck(cfg, seq, 2, device=device, backward=True).mismatches() == []


@pytest.mark.parametrize("live", ["cohere", "rmsnorm-two", "rmsnorm-one", "cohere-qk", "phi-qk", "rmsnorm-qk-gains"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_saved_activations_are_what_forward_leaves_alive(live, dtype):
    """Against the tracker on the live model: the parallel block keeps one residual stream (the block input) under
    RMSNorm, whose two norms keep the same tensor; LayerNorm keeps its centred input once per norm; q/k norms with a
    gain per head (Cohere's) keep its fp32 copy at 16 bits, heads·d_head."""
    from lm_accounting.analytic.activations import saved_activation_breakdown
    from lm_accounting.measure.memory import measure_step

    cfg = ModelConfig(**TINY, **LIVE[live], name=f"tiny-{live}")
    measured = measure_step(cfg, 7, 3, dtype, "meta", "for-loop")
    saved = saved_activation_breakdown(cfg, 7, 3, dtype)
    assert measured.forward.end - measured.baseline == saved.total > 0


def test_live_block_is_the_parallel_sum_and_the_norm_is_coheres():
    """On CPU: our block computes x + attn(ln1(x)) + ffn(ln1(x)) (no ln2), and our bias-free LayerNorm computes
    transformers' ``CohereLayerNorm``."""
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    from lm_accounting.model import build_model

    cfg = ModelConfig(**TINY, **LIVE["cohere"], name="tiny-cohere")
    model = build_model(cfg, device="cpu")
    block = model.layers[0]
    assert block.ln2 is None and block.ln1.bias is None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 32, generator=gen)
    with torch.no_grad():
        block.ln1.weight.copy_(torch.rand(32, generator=gen) + 0.5)
        reference = CohereLayerNorm(32)
        reference.weight.copy_(block.ln1.weight)
        torch.testing.assert_close(block.ln1(x), reference(x))
        positions = torch.arange(5)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        h = block.ln1(x)
        expected = x + block.attn(h, model.rope, positions, mask) + block.ffn(h)
        torch.testing.assert_close(block(x, model.rope, positions, mask), expected)


@pytest.mark.parametrize("live", PROGRAMMED)
def test_course_program_equals_the_live_model(live):
    """The op library's program of our model (``analytic/ops/course``) against the storage tracker on the live
    model, phase by phase, byte for byte: three setups (every checkpointing, precision and attention once) and
    checkpointing under amp-bf16 with either attention (the attention's output, a local of the block, alive while
    the FFN recomputes), B = 1 to 3."""
    from test_ops_course import BASE, assert_same, sample

    from lm_accounting.analytic.ops import predict_step, unsupported
    from lm_accounting.measure.memory import measure_step
    from lm_accounting.setup import TrainingSetup

    options = {k: v for k, v in LIVE[live].items() if k != "lm_head_bias"}  # not in the course program yet
    cfg = ModelConfig(**{**BASE, **options}, name=live)
    amp = [TrainingSetup(attention=a, checkpoint="full", precision="amp-bf16") for a in ("naive", "sdpa")]
    for setup in [*sample(live), *amp]:
        assert unsupported(cfg, setup, "course") == []
        for batch in (1, 2, 3):
            predicted = predict_step(cfg, 8, setup, impl="course", batch=batch).at(batch)
            assert_same(measure_step(cfg, 8, batch, setup=setup), predicted, f"{live} {setup.label} B={batch}")


def test_course_program_names_the_qk_norms_it_does_not_model():
    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    setup = TrainingSetup()
    gains = ModelConfig(**TINY, **LIVE["rmsnorm-qk-gains"])
    assert "per-head qk-norm gains" in unsupported(gains, setup, "course")[0]
    assert "LayerNorm qk-norm" in unsupported(ModelConfig(**TINY, **LIVE["phi-qk"]), setup, "course")[0]
