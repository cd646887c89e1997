"""Llama 4 (transformers' models/llama4: ``Llama4TextConfig``, ``Llama4ForCausalLM``, the ``llama4`` wrapper), exact
against transformers 5.24.

What Llama 4 brings: MoE layers every ``interleave_moe_layer_step``-th layer (the others a SwiGLU of
``intermediate_size_mlp``), each a router (d -> E, sigmoid of the top-k logits), E routed experts and one shared
expert of ``intermediate_size``; NoPE layers (``no_rope_layers`` 0: every 4th by default); chunked attention on the
RoPE layers (``attention_chunk_size``); an L2 q/k norm without weights (``use_qk_norm``); attention temperature
tuning on the NoPE layers.  The last two are elementwise and parameter-free: no count changes.

FLOP conventions (docs/conventions.md), both stated:

* routed experts: ``Llama4TextMoe`` repeats the T tokens E times and ``Llama4TextExperts`` runs them through all E
  experts in one ``torch.bmm``, the unchosen ones weighted by σ(−∞) = 0.  The totals count that, T·E rows
  (``ModelConfig.all_experts_run``), which is what FlopCounterMode counts; the routed top-k (top-1 for Scout and
  Maverick), what the router selects, is the labelled extra ``flops.routed_top_k_forward_flops``.
* chunked attention: eager attention computes the full S x S square and masks it (``create_chunked_causal_mask``):
  the totals count the square, as FlopCounterMode does; the chunked causal pairs are the labelled extra
  ``flops.chunked_attention_flops``, its pairs counted here against transformers' own mask function.

Configs: two small ones (an interleaved step of 2 with a 32-token chunk; biased attention with top-2 of 4 experts
in every layer), and the published text models of meta-llama/Llama-4-Scout-17B-16E and
Llama-4-Maverick-17B-128E-Instruct (their config.json's ``text_config`` and ``vision_config``, written out below from
memory of the hub files: this machine is offline, so a misremembered value changes which model is checked, not
whether the check can fail).  Method as tests/test_transformers_truth.py: transformers' model on meta, eager
attention, parameters by name, FlopCounterMode over one forward at two lengths (24 and 80 tokens, the second past
the 32-token chunk).
"""

import json

import pytest

from lm_accounting.analytic.flops import (
    chunked_attention_flops,
    chunked_pairs,
    forward_flops,
    matmul_flops,
    routed_top_k_forward_flops,
    training_flops,
)
from lm_accounting.analytic.memory import parameter_tensor_sizes
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import assert_forward_flops_by_component, assert_parameters_equal, layer_keys
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
CHUNK = 32
TINY = {
    "model_type": "llama4_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,
    "attention_chunk_size": CHUNK,
    "max_position_embeddings": 1024,
    **NO_IDS,
}
CONFIGS = {
    "llama4-tiny": TINY,
    "llama4-tiny-top2-bias": {
        **TINY,
        "num_hidden_layers": 3,
        "num_experts_per_tok": 2,
        "interleave_moe_layer_step": 1,
        "attention_bias": True,
        "use_qk_norm": False,
        "no_rope_layers": [1, 0, 1],
    },
}
SEQS = (24, 80)  # the second past the 32-token chunk

NOPE = [int((i + 1) % 4 != 0) for i in range(48)]  # both files: every 4th layer NoPE (1 = RoPE)
SCOUT_TEXT = {  # meta-llama/Llama-4-Scout-17B-16E/config.json: text_config
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "attention_dropout": 0.0,
    "attn_scale": 0.1,
    "attn_temperature_tuning": True,
    "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008],
    "floor_scale": 8192,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760,
    "model_type": "llama4_text",
    "moe_layers": list(range(48)),
    "no_rope_layers": NOPE,
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "output_router_logits": False,
    "pad_token_id": 200018,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 16.0,
        "high_freq_factor": 1.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_qk_norm": True,
    "vocab_size": 202048,
}
MAVERICK_TEXT = {  # meta-llama/Llama-4-Maverick-17B-128E-Instruct: Scout's but for these
    **SCOUT_TEXT,
    "interleave_moe_layer_step": 2,
    "moe_layers": list(range(1, 48, 2)),
    "num_local_experts": 128,
    "use_qk_norm": False,
    "max_position_embeddings": 1048576,
    "rope_scaling": None,
}
VISION = {  # both files' vision_config
    "attention_dropout": 0.0,
    "hidden_act": "gelu",
    "hidden_size": 1408,
    "image_size": 336,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "model_type": "llama4_vision_model",
    "multi_modal_projector_bias": False,
    "norm_eps": 1e-05,
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 34,
    "patch_size": 14,
    "pixel_shuffle_ratio": 0.5,
    "projector_dropout": 0.0,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
    "rope_theta": 10000,
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "default",
    "vision_output_dim": 4096,
}


def wrapper(text: dict, vision: dict = VISION) -> dict:
    return {
        "model_type": "llama4",
        "architectures": ["Llama4ForConditionalGeneration"],
        "boi_token_index": 200080,
        "eoi_token_index": 200081,
        "image_token_index": 200092,
        "text_config": text,
        "tie_word_embeddings": False,
        "vision_config": vision,
    }


PUBLISHED = {"llama-4-scout-17b-16e": wrapper(SCOUT_TEXT), "llama-4-maverick-17b-128e": wrapper(MAVERICK_TEXT)}

LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.q_proj.bias": ("attn.q_proj.bias",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.k_proj.bias": ("attn.k_proj.bias",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.v_proj.bias": ("attn.v_proj.bias",),
    "self_attn.o_proj": ("attn.output_proj",),
    "self_attn.o_proj.bias": ("attn.output_proj.bias",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "feed_forward.gate_proj": ("ffn.w1",),
    "feed_forward.up_proj": ("ffn.w3",),
    "feed_forward.down_proj": ("ffn.w2",),
    "feed_forward.router": ("moe.router",),
    "feed_forward.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "feed_forward.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "feed_forward.experts.down_proj": ("moe.experts.w2",),
    "feed_forward.shared_expert.gate_proj": ("moe.shared.w1",),
    "feed_forward.shared_expert.up_proj": ("moe.shared.w3",),
    "feed_forward.shared_expert.down_proj": ("moe.shared.w2",),
}
TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
our_keys = layer_keys(LAYER_MAP, TOP)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


def test_the_small_configs_have_what_llama4_brings(models):
    """The options are on: chunked RoPE layers beside NoPE ones, interleaved MoE, experts run on every token."""
    cfg = config_from_hf(CONFIGS["llama4-tiny"])
    hf = models["llama4-tiny"].config
    assert cfg.nope_layers == tuple(i for i, r in enumerate(hf.no_rope_layers) if not r) == (3,)
    assert [cfg.layer_chunked(i) for i in range(4)] == [t == "chunked_attention" for t in hf.layer_types]
    assert [cfg.layer_moe(i) for i in range(4)] == [i in hf.moe_layers for i in range(4)] == [False, True] * 2
    assert cfg.all_experts_run and cfg.attention_chunk == CHUNK and cfg.d_ff == 96 and cfg.expert_width == 32
    biased = config_from_hf(CONFIGS["llama4-tiny-top2-bias"])
    assert biased.qkv_bias and biased.output_bias and biased.nope_layers == (1,) and biased.moe_layers == 3


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, our_keys, with_empty=False)
    assert parameter_tensor_sizes(cfg, implementation="transformers") == [p.numel() for p in model.parameters()]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", SEQS)
def test_forward_flops_equal_transformers(name, seq, models, meta_masks):  # noqa: F811
    """Every expert on every token (T·E rows) and the full S x S square on the chunked layers: what
    FlopCounterMode counts, per module."""
    counted = hf_forward_flops(models[name], seq)
    fwd = forward_flops(config_from_hf(CONFIGS[name], name=name).with_context(seq), seq)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, "model.layers.", "self_attn")
    experts = sum(v for k, v in counted.items() if k.endswith("feed_forward.experts"))
    e, d, f, t = TINY["num_local_experts"], TINY["hidden_size"], TINY["intermediate_size"], seq
    moe_layers = len(models[name].config.moe_layers)
    assert experts == moe_layers * 3 * 2 * (t * e) * d * f  # T·E rows through W1, W3 (gate_up) and W2


@pytest.mark.parametrize("name", CONFIGS)
def test_routed_top_k_is_the_labelled_extra(name):
    """The routed top-k, what the router selects: the total less the (E − k) unchosen experts' rows, by hand;
    the training step's PaLM form still equals 3 x the forward (its N_matmul runs every expert, as the step)."""
    cfg = config_from_hf(CONFIGS[name]).with_context(80)
    e, k, d, f = cfg.num_experts, cfg.experts_per_token, cfg.d_model, cfg.expert_width
    for seq in SEQS:
        idle = cfg.moe_layers * 3 * matmul_flops(seq * (e - k), d, f)
        assert routed_top_k_forward_flops(cfg, seq) == forward_flops(cfg, seq).total - idle
    t = training_flops(cfg, 80)
    assert t.palm == t.step == 3 * forward_flops(cfg, 80).total
    assert active_parameter_count(cfg) == parameter_breakdown(cfg).total - cfg.moe_layers * (e - k) * 3 * d * f


@pytest.mark.parametrize("seq", [1, 31, 32, 33, 80, 96])
def test_chunked_pairs_equal_transformers_mask(seq):
    """``chunked_pairs`` against transformers' own mask function (``chunked_causal_mask_function``, no left
    padding), evaluated pair by pair."""
    from transformers.masking_utils import chunked_causal_mask_function

    allowed = chunked_causal_mask_function(CHUNK, torch.zeros(1, dtype=torch.long))
    q, kv = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    visible = int(allowed(torch.tensor(0), torch.tensor(0), q, kv).expand(seq, seq).sum())
    assert chunked_pairs(seq, CHUNK) == visible


def test_chunked_attention_is_the_labelled_extra():
    """Chunked layers count their chunked pairs, the NoPE layer the full square: 4·B·h·pairs·d_head and
    4·B·h·S²·d_head."""
    cfg = config_from_hf(TINY)
    h, dh, seq = cfg.num_heads, cfg.d_head, 80
    pairs = 2 * (CHUNK * (CHUNK + 1) // 2) + 16 * 17 // 2
    assert chunked_attention_flops(cfg, seq) == 3 * 4 * h * pairs * dh + 1 * 4 * h * seq * seq * dh
    fwd = forward_flops(cfg.with_context(seq), seq)
    assert fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total == 4 * 4 * h * seq * seq * dh


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_text_models_equal_transformers(name):
    """Scout and Maverick: our count of the text model equals transformers' ``Llama4ForCausalLM`` built on meta
    from the same text_config, and of the whole ``Llama4ForConditionalGeneration`` its language model; the vision
    tower and projector (871,932,416 parameters in transformers' model of these vision_configs) are not counted.
    Published: "17B active", "109B total" (Scout, with the vision tower: 108.6B), "400B total" (Maverick)."""
    values = PUBLISHED[name]
    cfg = config_from_hf(values, name=name)
    assert cfg.name == f"{name} (text model of a llama4 wrapper; the vision tower is not counted)"
    total, active = parameter_breakdown(cfg).total, active_parameter_count(cfg)
    text = {**values["text_config"], **NO_IDS}
    assert total == sum(p.numel() for p in build_hf(text).parameters())
    config = transformers.AutoConfig.for_model(**{k: v for k, v in values.items()})
    with torch.device("meta"):
        whole = transformers.Llama4ForConditionalGeneration(config)
    language = sum(p.numel() for n, p in whole.named_parameters() if n.startswith("language_model."))
    vision = sum(p.numel() for p in whole.parameters()) - language
    assert total == language and vision == 871_932_416
    assert active // 10**9 == 17
    if name.startswith("llama-4-scout"):
        assert (total, active) == (107_769_861_120, 17_172_894_720)
        assert round((total + vision) / 10**9) == 109
    else:
        assert (total, active) == (400_711_848_960, 17_184_691_200)
        assert total // 10**9 == 400


@pytest.mark.parametrize(("wrapper_tie", "text_tie"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_small_wrapper_is_its_text_model(wrapper_tie, text_tie):
    """A tiny ``llama4`` wrapper: our count equals transformers' language model inside
    ``Llama4ForConditionalGeneration``; the text_config's ``tie_word_embeddings`` ties the head, not the
    wrapper's (``Llama4ForCausalLM(config.text_config)``; ``hf_config.TIED_BY_TEXT``)."""
    vision = {
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
        "vision_output_dim": 32,
        "projector_input_dim": 32,
        "projector_output_dim": 32,
    }
    text = {**TINY, "tie_word_embeddings": text_tie}
    values = {**wrapper(text, vision), "tie_word_embeddings": wrapper_tie}
    cfg = config_from_hf(values, name="tiny")
    config = transformers.AutoConfig.for_model(**values)
    with torch.device("meta"):
        whole = transformers.Llama4ForConditionalGeneration(config)
    language = sum(p.numel() for n, p in whole.named_parameters() if n.startswith("language_model."))
    assert cfg.tie_embeddings == text_tie and parameter_breakdown(cfg).total == language
    assert "tie_word_embeddings" in cfg.ignored_fields and "text_config.tie_word_embeddings" not in cfg.ignored_fields


def test_saved_config_is_read_the_same():
    """What ``save_pretrained`` writes (the derived ``moe_layers``, ``no_rope_layers``, ``layer_types``,
    ``rope_parameters``) reads as the hub file does."""
    config = transformers.AutoConfig.for_model(**{k: v for k, v in TINY.items()})
    saved = config.to_dict()
    assert {"moe_layers", "no_rope_layers", "layer_types"} <= set(saved)
    assert config_from_hf(saved) == config_from_hf(TINY)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"moe_layers": [0, 2]}, "field 'moe_layers' = [0, 2] is not supported"),
        ({"interleave_moe_layer_step": 5}, "no layer is a mixture of experts"),
        ({"interleave_moe_layer_step": 0}, "field 'interleave_moe_layer_step' must be between 1 and 10^18"),
        ({"intermediate_size": None}, "field 'intermediate_size' must be an integer"),
        ({"hidden_size": None}, "field 'hidden_size' must be an integer"),
        ({"no_rope_layers": [1, 1]}, "field 'no_rope_layers' must be a list of 0/1 flags, one per layer (4)"),
        ({"layer_types": ["full_attention"] * 4}, "field 'layer_types' is not supported for Llama 4"),
        ({"attention_chunk_size": -8}, "field 'attention_chunk_size' must be between 1 and 10^18"),
        ({"hidden_act": "relu"}, "field 'hidden_act' = 'relu' is not supported"),
    ],
)
def test_bad_llama4_fields_are_one_line_exit_2(change, message, run_cli, tmp_path):
    values = {**TINY, **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    for command in ("account", "memory"):
        r = run_cli(command, path)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_missing_sizes_are_one_line_exit_2(run_cli, tmp_path):
    for missing in ("intermediate_size", "hidden_size", "vocab_size"):
        path = tmp_path / f"{missing}.json"
        path.write_text(json.dumps({k: v for k, v in TINY.items() if k != missing}))
        r = run_cli("account", path)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        assert f"missing required field '{missing}' (model_type 'llama4_text')" in r.err


def test_account_states_both_conventions_and_memory_replays_the_step(run_cli, tmp_path):
    path = tmp_path / "scout" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(PUBLISHED["llama-4-scout-17b-16e"]))
    r = run_cli("account", path, "--context", 16384)
    assert r.code == 0, r.err
    assert "with each token's top-1 only, what the router selects (labelled extra, not in the total)" in r.out
    assert "only each query's own chunk on the 36 chunked layers (Llama 4, chunk 8,192" in r.out
    assert "the vision tower is not counted" in r.out
    r = run_cli("account", path, "--context", 16384, "--format", "json")
    out = json.loads(r.out)
    cfg = config_from_hf(PUBLISHED["llama-4-scout-17b-16e"]).with_context(16384)
    assert out["forward_flops_routed_top_k"] == routed_top_k_forward_flops(cfg, 16384) < out["forward_flops"]["total"]
    assert out["attention_matmul_flops"]["chunked"] == chunked_attention_flops(cfg, 16384)
    assert out["config"]["attention_chunk"] == 8192 and out["config"]["all_experts_run"] is True
    r = run_cli("memory", path, "--context", 1024)
    # the llama4 program (tests/test_ops_transformers_llama4.py) replays the step: no "model states only" line
    assert r.code == 0 and "model states only" not in r.out and "Llama4ForCausalLM" in r.out, r.out


def test_the_llama4_options_need_what_they_describe():
    """``all_experts_run`` on a dense model and ``attention_chunk`` beside a sliding window are refused in one line."""
    import dataclasses

    cfg = config_from_hf(TINY)
    moe = {"num_experts": None, "experts_per_token": None, "expert_d_ff": None, "shared_experts": 0, "moe_every": 1}
    dense = dataclasses.replace(cfg, all_experts_run=False, attention_chunk=None, **moe)
    with pytest.raises(ConfigError, match="all_experts_run applies only to a mixture of experts"):
        dataclasses.replace(dense, all_experts_run=True)
    with pytest.raises(ConfigError, match="attention_chunk is modelled as Llama 4's chunked attention"):
        dataclasses.replace(cfg, sliding_window=16)
    with pytest.raises(ConfigError, match="attention_chunk must be"):
        dataclasses.replace(cfg, attention_chunk=0)
    assert "attention_chunk" not in dense.resolved() and "all_experts_run" not in dense.resolved()


def test_infer_refuses_chunked_attention_in_one_line(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    r = run_cli("infer", path, "--prompt", 64, "--generate", 8)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "infer does not model Llama 4's chunked attention yet" in r.err


def test_reading_and_accounting_llama4_imports_no_torch(tmp_path):
    """The analytic path: a Llama 4 wrapper read and accounted in a fresh process, no torch, no transformers."""
    import subprocess
    import sys

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PUBLISHED["llama-4-maverick-17b-128e"]))
    code = (
        "import sys\n"
        "from lm_accounting import load_config, account\n"
        f"a = account(load_config({str(path)!r}), seq=4096)\n"
        "a.to_dict()\n"
        "print(a.params.total, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["400711848960", "False", "False"]


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_forward_flops_equal_transformers(name, meta_masks):  # noqa: F811
    """Scout and Maverick whole on meta: FlopCounterMode over 1,024 tokens equals our forward FLOPs, every expert
    on every token (16 and 128 of them)."""
    text = {**PUBLISHED[name]["text_config"], **NO_IDS}
    counted = hf_forward_flops(build_hf(text), 1024)
    fwd = forward_flops(config_from_hf(PUBLISHED[name]).with_context(1024), 1024)
    assert_forward_flops_by_component(fwd, counted, our_keys, TOP, LAYER_MAP, "model.layers.", "self_attn")


def test_a_moe_step_that_does_not_divide_the_layers_is_transformers_own():
    """``interleave_moe_layer_step`` 3 on 4 layers: transformers' ``moe_layers`` is range(2, 4, 3) = [2], our
    (i + 1) % 3 == 0 the same layer; read and counted exactly, not refused (the 5th layer would be dense)."""
    values = {**TINY, "interleave_moe_layer_step": 3}
    cfg = config_from_hf(values)
    model = build_hf(values)
    assert [cfg.layer_moe(i) for i in range(4)] == [i in model.config.moe_layers for i in range(4)]
    assert parameter_breakdown(cfg).total == sum(p.numel() for p in model.parameters())


def test_the_live_model_refuses_llama4_in_one_line(run_cli, tmp_path):
    """Our live model (lm_accounting/model) routes top-k and has no chunks: crosscheck refuses rather than compare
    it with figures of transformers' code."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    r = run_cli("crosscheck", path, "--context", 16)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "the live model (lm_accounting/model) routes each token to its top-k experts" in r.err
