"""Real config.json files are accepted; only a real doubt refuses (issue 25, part 4).

* The committed facts about transformers' configuration classes (lm_accounting/hf_fields.py) equal what the
  installed transformers says, derived here from the classes themselves, so they cannot drift.
* A field the class does not define is ignored and listed (``--verbose``); one it defines and we do not
  understand is refused.
* Every supported model_type survives ``AutoConfig`` -> ``save_pretrained`` -> ``lm-account`` with the
  hub file's parameter and FLOP counts (configs only: no model is built).
* The hub's GPT-2 medium file and Gemma-3's multimodal wrapper are read, with hand-computed counts.
"""

import dataclasses
import inspect
import json
import re

import pytest

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ConfigError, load_config
from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES, config_from_hf
from lm_accounting.hf_fields import (
    ALIASES,
    CLASS_DEFAULTS,
    CONFIG_CLASSES,
    DEFINED_FIELDS,
    WRAPPED_TEXT_DEFAULTS,
    WRAPPERS,
    WRAPPERS_OF_ANY_TEXT,
)

transformers = pytest.importorskip("transformers")
from test_arch_bloom import CONFIGS as BLOOM
from test_arch_dsa import CONFIGS as DSA
from test_arch_dsa import TINY_CONFIGS as DSA_TINY
from test_arch_ernie4_5_moe import CONFIGS as ERNIE
from test_arch_lfm2 import CONFIGS as LFM2
from test_arch_lfm2 import TINY_CONFIGS as LFM2_TINY
from test_arch_llama4 import CONFIGS as LLAMA4
from test_arch_llama4 import PUBLISHED as LLAMA4_PUBLISHED
from test_arch_mamba import CONFIGS as SSM
from test_arch_mamba import TINY_CONFIGS as SSM_TINY
from test_arch_mamba2 import CONFIGS as MAMBA2
from test_arch_mamba2 import TINY_CONFIGS as MAMBA2_TINY
from test_arch_olmo import CONFIGS as OLMO
from test_arch_parallel_block import CONFIGS as PARALLEL
from test_arch_qwen2_moe import CONFIGS as QWEN2_MOE
from test_arch_qwen3_next import CONFIGS as QWEN3_NEXT
from test_arch_qwen3_next import TINY_CONFIGS as QWEN3_NEXT_TINY
from test_arch_relu import CONFIGS as RELU
from test_gpt_oss import CONFIGS as GPT_OSS
from test_hf_zoo import PUBLISHED, WRAPPED, ZOO
from test_transformers_truth import CONFIGS

CONFIG_TYPES = SUPPORTED_MODEL_TYPES + tuple(WRAPPERS)

# openai-community/gpt2-medium's config.json as published on the hub (2019; transformers 2.x fields)
GPT2_MEDIUM = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 1024,
    "n_head": 16,
    "n_layer": 24,
    "n_positions": 1024,
    "n_special": 0,
    "predict_special_tokens": True,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
# google/gemma-3-4b-it's config.json as published: the text_config leaves heads, head size and vocab to
# Gemma3TextConfig's defaults
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


# -- the committed data equals transformers' classes ----------------------------------------------------
def config_class(model_type: str):
    return transformers.CONFIG_MAPPING[model_type]


def defined_by(cls) -> set[str]:
    """Every name through which a config.json field reaches the class (see hf_fields' docstring)."""
    names = set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    names |= {f.name for f in dataclasses.fields(cls)} | set(cls.attribute_map) | set(cls.attribute_map.values())
    for klass in cls.__mro__:
        names |= {k for k, v in vars(klass).items() if isinstance(v, property) and v.fset is not None}
        for method in ("__post_init__", "convert_rope_params_to_dict"):
            if method in vars(klass):
                source = inspect.getsource(vars(klass)[method])
                names |= set(re.findall(r'kwargs\.(?:get|pop)\(\s*"(\w+)"', source))
                names |= {n for n in re.findall(r"self\.(\w+)\s*=[^=]", source) if not n.startswith("_")}
    return names


@pytest.mark.parametrize("model_type", CONFIG_TYPES)
def test_defined_fields_are_transformers_own(model_type):
    cls = config_class(model_type)
    assert CONFIG_CLASSES[model_type] == cls.__name__
    assert DEFINED_FIELDS[model_type] == defined_by(cls)
    assert ALIASES.get(model_type, {}) == dict(cls.attribute_map)


def test_the_rule_sees_the_known_fields():
    """The derivation catches what the issue names: n_special is not GPT2Config's; qk_head_dim (set in
    __post_init__) is DeepSeek's; num_local_experts (attribute_map) is Qwen3-MoE's; sliding_window_pattern
    (read from kwargs) is Gemma3TextConfig's, not Gemma2Config's."""
    assert {"n_special", "predict_special_tokens", "unsloth_version"}.isdisjoint(DEFINED_FIELDS["gpt2"])
    assert "qk_head_dim" in DEFINED_FIELDS["deepseek_v2"] and "qk_head_dim" in DEFINED_FIELDS["deepseek_v3"]
    assert "num_local_experts" in DEFINED_FIELDS["qwen3_moe"] and "per_layer_config" in DEFINED_FIELDS["llama"]
    assert "sliding_window_pattern" in DEFINED_FIELDS["gemma3_text"]
    assert "sliding_window_pattern" not in DEFINED_FIELDS["gemma2"]


@pytest.mark.parametrize("model_type", sorted(CLASS_DEFAULTS))
def test_class_defaults_are_transformers_own(model_type):
    cls = config_class(model_type)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for key, value in CLASS_DEFAULTS[model_type].items():
        if key == "rope_theta":
            theta = cls.default_theta
            assert value == (theta["global"] if isinstance(theta, dict) else theta)
        else:
            assert defaults[key] == value and type(defaults[key]) is type(value), key


def test_wrappers_and_their_text_defaults_are_transformers_own():
    for wrapper, text_type in WRAPPERS.items():
        cls = config_class(wrapper)
        assert cls().text_config.model_type == text_type  # the text model a wrapper without one gets
        any_text = cls.sub_configs["text_config"] is transformers.AutoConfig
        assert any_text == (wrapper in WRAPPERS_OF_ANY_TEXT)
        if text_type in WRAPPED_TEXT_DEFAULTS:
            text_cls = config_class(text_type)
            defaults = {f.name: f.default for f in dataclasses.fields(text_cls)}
            assert WRAPPED_TEXT_DEFAULTS[text_type] == {k: defaults[k] for k in WRAPPED_TEXT_DEFAULTS[text_type]}


MINIMAL = {  # only the fields the reader requires; transformers fills the rest from its class defaults
    "vocab_size": 1000,
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 32,  # Qwen2's default of 32 KV heads needs as many query heads
    "intermediate_size": 1024,
    "max_position_embeddings": 2048,
}
MOE_MINIMAL = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256},
    "deepseek_v2": {"num_experts_per_tok": 2, "num_key_value_heads": 32},
    "deepseek_v3": {"num_key_value_heads": 32},
    "granitemoe": {"num_local_experts": 8},
    "granitemoeshared": {"num_local_experts": 8},
    "olmoe": {"num_experts": 8},
    "phimoe": {"num_local_experts": 8},
    "hy_v3": {"num_experts": 8},
    "glm4_moe_lite": {"num_key_value_heads": 32},
    "deepseek_v32": {"num_key_value_heads": 32},
    "glm_moe_dsa": {"num_key_value_heads": 32},
    "mamba2": {"num_heads": 32, "head_dim": 64},  # Mamba2Config requires heads · head_dim = 2 · hidden_size
    "helium": {
        "head_dim": 32,
        "num_key_value_heads": 32,
    },  # Helium's o_proj is hidden_size square: heads · head_dim must be hidden_size
    "ministral": {"head_dim": 32},  # MinistralAttention reads head_dim as given: null does not build
    "hunyuan_v1_dense": {"head_dim": 32},
    "hunyuan_v1_moe": {"head_dim": 32, "num_experts": 8, "moe_topk": 2},
    "sarvam_mla": {"num_key_value_heads": 32},
    "youtu": {"num_key_value_heads": 32},
    "gpt_oss": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "ernie4_5_moe": {"moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 256},
    "gptj": {"rotary_dim": 16},  # the class's 64 exceeds MINIMAL's heads of 32
    "falcon": {"multi_query": False},
    "opt": {"ffn_dim": 1024},  # OPT's MLP width field (test_arch_relu)
    "nemotron": {
        "num_key_value_heads": 32
    },  # the class's None does not build (test_arch_relu)  # the class's one K/V head is no num_key_value_heads (test_arch_parallel_block)
    "nemotron_h": {"hybrid_override_pattern": "M-*-" * 3},  # the class's default pattern has a MoE layer (E)
    "granitemoehybrid": {"num_local_experts": 0},  # the class's 8 routed experts beside Mamba2 are refused
    "lfm2_moe": {  # Lfm2MoeConfig derives no layer_types; the expert counts and width are required (as Qwen3-MoE's)
        "layer_types": ["conv", "full_attention"] * 6,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
    },
    "qwen2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 512,
    },
}


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_absent_fields_take_the_class_defaults(model_type):
    """A config.json that leaves optional fields out: the heads, head size, window and tie flag transformers
    resolves (e.g. Mistral's 4,096-token window, Qwen3's head_dim 128, Gemma's 4 KV heads)."""
    if model_type in ("gpt2", "gpt_bigcode"):
        values = {"vocab_size": 1000, "n_embd": 512, "n_layer": 12, "n_head": 8, "n_positions": 2048}
    else:
        values = {**MINIMAL, **MOE_MINIMAL.get(model_type, {})}
    ours = config_from_hf({"model_type": model_type, **values})
    hf = transformers.AutoConfig.for_model(model_type, **values)
    assert ours.tie_embeddings == hf.tie_word_embeddings
    eps = [getattr(hf, k) for k in ("rms_norm_eps", "layer_norm_epsilon", "norm_epsilon") if hasattr(hf, k)]
    assert ours.norm_eps == (eps[0] if eps else 1e-5)  # OlmoLayerNorm's constant: OlmoConfig has no eps field
    if not ours.mla and ours.attention_layers:  # a pure Mamba2 has no attention heads to resolve
        assert ours.kv_heads == (getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads)
        assert ours.d_head == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    layer_types = getattr(hf, "layer_types", None)
    window = getattr(hf, "sliding_window", None)
    windowed = 0 if not window else sum(t == "sliding_attention" for t in layer_types) if layer_types else 12
    assert ours.windowed_layers == windowed
    if ours.windowed_layers:
        assert ours.sliding_window == window


# -- the save_pretrained round trip ---------------------------------------------------------------------
def counts(cfg) -> tuple[int, int]:
    seq = min(1024, cfg.context_length)
    return parameter_breakdown(cfg).total, forward_flops(cfg, seq).total


HUB_FILES = {
    **{name: values for name, (values, _) in CONFIGS.items()},
    "gemma-3-4b-it": GEMMA3_4B,
    **PUBLISHED,
    **WRAPPED,
    **{f"zoo-{t}": {"model_type": t, **values} for t, values in ZOO.items()},
    **{name: values for name, (values, _) in GPT_OSS.items()},
    **QWEN2_MOE,
    **OLMO,
    **{name: values for name, (values, _) in BLOOM.items()},
    **ERNIE,
    **QWEN3_NEXT,
    **QWEN3_NEXT_TINY,
    **PARALLEL,
    **RELU,
    **DSA,
    **DSA_TINY,
    **LLAMA4,
    **LLAMA4_PUBLISHED,
    **MAMBA2,
    **MAMBA2_TINY,
    **LFM2,
    **LFM2_TINY,
    **SSM,
    **SSM_TINY,
}


def test_every_config_type_has_a_hub_file():
    assert {values["model_type"] for values in HUB_FILES.values()} == set(CONFIG_TYPES)


@pytest.mark.parametrize("name", HUB_FILES)
def test_save_pretrained_round_trip(name, tmp_path, run_cli):
    """hub file -> AutoConfig -> save_pretrained (transformers 5.x spellings: qk_head_dim, num_local_experts,
    rope_parameters, dtype, ...) -> lm-account: the same parameters and forward FLOPs as the hub file."""
    hub = HUB_FILES[name]
    values = dict(hub)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    config.save_pretrained(tmp_path / name)
    saved = tmp_path / name / "config.json"
    hub_path = tmp_path / "hub.json"
    hub_path.write_text(json.dumps(hub))
    assert counts(load_config(saved)) == counts(load_config(hub_path))
    r = run_cli("account", saved, "--format", "json", "--context", min(1024, load_config(saved).context_length))
    assert r.code == 0, r.err
    assert json.loads(r.out)["parameters"]["total"] == counts(load_config(hub_path))[0]


def test_what_save_pretrained_writes_is_read():
    """The spellings transformers 5.x writes that the hub files do not use."""
    v3 = config_from_hf({**CONFIGS["deepseek-v3"][0], "qk_head_dim": 192, "head_dim": 64})
    assert v3.d_head == 192
    with pytest.raises(ConfigError, match="'qk_head_dim' = 128 must be qk_nope_head_dim \\+ qk_rope_head_dim"):
        config_from_hf({**CONFIGS["deepseek-v3"][0], "qk_head_dim": 128})
    hub = CONFIGS["qwen3-30b-a3b"][0]
    saved = {k: v for k, v in hub.items() if k != "num_experts"} | {"num_local_experts": 128}
    assert config_from_hf(saved).num_experts == 128 == config_from_hf(hub).num_experts
    with pytest.raises(ConfigError, match="'num_experts' and 'num_local_experts' are two names for one setting"):
        config_from_hf({**hub, "num_local_experts": 64})
    mixtral = CONFIGS["mixtral-8x7b"][0]
    both = config_from_hf({**mixtral, "num_experts": 8})  # both spellings, agreeing: read once, neither refused
    assert both.num_experts == 8 and "num_experts" not in both.ignored_fields
    image_ids = {**GEMMA3_4B, "image_token_id": 5}  # two spellings of a setting that changes no count
    assert "image_token_id" in config_from_hf(image_ids).ignored_fields
    v3_alias = {k: v for k, v in CONFIGS["deepseek-v3"][0].items() if k != "n_routed_experts"}
    assert config_from_hf({**v3_alias, "num_local_experts": 256}).num_experts == 256


def test_fine_tuning_fields_are_ignored_and_listed(run_cli, tmp_path):
    values = CONFIGS["llama-3.1-8b"][0]
    tuned = {**values, "unsloth_version": "2025.3.19", "unsloth_fixed": True}
    assert counts(config_from_hf(tuned)) == counts(config_from_hf(values))
    assert {"unsloth_version", "unsloth_fixed"} <= set(config_from_hf(tuned).ignored_fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tuned))
    r = run_cli("account", path, "--verbose")
    assert r.code == 0 and "unsloth_version" in r.err and "unsloth_fixed" in r.err


def test_a_defined_field_not_understood_is_refused(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["llama-3.1-8b"][0], "per_layer_config": {"0": {"intermediate_size": 8}}}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "field 'per_layer_config' is not understood for model_type 'llama' (transformers' LlamaConfig" in r.err


# -- GPT-2 medium and the Gemma-3 wrapper -----------------------------------------------------------------
def test_hub_gpt2_medium_config(run_cli, tmp_path):
    """354,823,168 = embeddings (50,257 + 1,024) · 1,024 + 24 layers · (12·1,024² + 13·1,024) + final LayerNorm
    2·1,024 (tied head): the published GPT-2 medium count."""
    d, layers = 1024, 24
    hand = (50257 + 1024) * d + layers * (12 * d * d + 13 * d) + 2 * d
    assert hand == 354_823_168
    folder = tmp_path / "gpt2-medium-hub"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2_MEDIUM, indent=2))
    r = run_cli("account", folder / "config.json", "--format", "json", "--verbose")
    assert r.code == 0, r.err
    assert json.loads(r.out)["parameters"]["total"] == hand
    assert "n_special" in r.err and "predict_special_tokens" in r.err and "task_specific_params" in r.err


def gemma3_4b_text_parameters(tied: bool) -> int:
    """google/gemma-3-4b-it's text model by hand: vocab 262,208 and 8 heads / 4 KV heads of 256 from
    Gemma3TextConfig's defaults; per layer Q and O 2,560·2,048, K and V 2,560·1,024, q/k norms 256 each,
    a GeGLU MLP 3·2,560·10,240 and four RMSNorms of 2,560."""
    d, vocab, layers = 2560, 262_208, 34
    per_layer = 2 * d * 2048 + 2 * d * 1024 + 2 * 256 + 3 * d * 10240 + 4 * d
    return vocab * d * (1 if tied else 2) + layers * per_layer + d


def test_gemma3_wrapper_is_read_through_its_text_model(run_cli, tmp_path):
    folder = tmp_path / "gemma-3-4b-it"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(GEMMA3_4B))
    cfg = load_config(path)
    assert parameter_breakdown(cfg).total == gemma3_4b_text_parameters(tied=True) == 3_880_263_168
    assert cfg.name == "gemma-3-4b-it (text model of a gemma3 wrapper; the vision tower is not counted)"
    assert (cfg.num_heads, cfg.kv_heads, cfg.d_head, cfg.vocab_size) == (8, 4, 256, 262_208)
    assert (cfg.sliding_window, cfg.full_attention_every, cfg.windowed_layers) == (1024, 6, 34 - 5)
    assert "vision_config" in cfg.ignored_fields and "text_config.rope_scaling" in cfg.ignored_fields
    text = transformers.AutoConfig.for_model("gemma3", **{k: v for k, v in GEMMA3_4B.items() if k != "model_type"})
    t = text.text_config  # the same fields, as transformers fills them
    assert (t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.vocab_size) == (8, 4, 256, 262_208)
    assert sum(x == "sliding_attention" for x in t.layer_types) == cfg.windowed_layers
    untied = load_config(_write(tmp_path / "untied.json", {**GEMMA3_4B, "tie_word_embeddings": False}))
    assert parameter_breakdown(untied).total == gemma3_4b_text_parameters(tied=False)
    text_only_flag = {**GEMMA3_4B, "text_config": {**GEMMA3_4B["text_config"], "tie_word_embeddings": False}}
    assert load_config(_write(tmp_path / "flag.json", text_only_flag)).tie_embeddings  # the wrapper's flag rules
    r = run_cli("account", path)
    assert r.code == 0 and "text model of a gemma3 wrapper; the vision tower is not counted" in r.out


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"text_config": None}, "is a multimodal wrapper and its text model ('text_config') is missing"),
        ({"text_config": [1]}, "its text model ('text_config') is not an object"),
        ({"text_config": {"model_type": "llama"}}, "field 'text_config.model_type' must be 'gemma3_text'"),
        ({"model_type": "llava"}, "unsupported model_type 'llava'"),
    ],
)
def test_a_wrapper_without_a_text_model_is_one_line(run_cli, tmp_path, change, message):
    data = {**GEMMA3_4B, **change}
    if change.get("text_config", 0) is None:
        del data["text_config"]
    path = _write(tmp_path / "config.json", data)
    for command in ("account", "memory"):
        r = run_cli(command, path)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err
