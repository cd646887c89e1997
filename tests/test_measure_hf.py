"""transformers' own model, built from our config (``hf_config.to_hf_dict``) and measured by our tracker
(``lm_accounting.measure.hf``).

* The reverse map: every preset with an ``hf_model_type`` and every config.json of
  tests/test_transformers_truth.py, written back with ``to_hf_dict`` and built by transformers on meta, has
  exactly the parameter count of our analytic breakdown (deep models at a few layers: the count is
  embedding + head + layers, and each kind of layer, dense and sparse, is kept).
"""

import dataclasses

import pytest

from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ConfigError, load_config, preset_names
from lm_accounting.hf_config import config_from_hf, to_hf_dict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_transformers_truth import CONFIGS  # the committed config.json values

TYPED = [n for n in preset_names() if load_config(n).hf_model_type is not None]


def few_layers(cfg):
    """``cfg`` at the fewest layers that keep each kind of layer (a dense one, a sparse one, a full-attention
    one among windowed ones): the parameter count of the rest is the same layers again."""
    keep = max(2, cfg.dense_layers_first + cfg.moe_every, cfg.full_attention_every or 0)
    return dataclasses.replace(cfg, num_layers=min(cfg.num_layers, keep))


def hf_parameters(cfg) -> int:
    values = to_hf_dict(cfg)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_presets_of_published_models_name_their_transformers_class():
    """The presets that are a transformers model name its model_type (as config.json does); the course
    presets name none, and the type changes no figure (it takes no part in equality)."""
    types = {n: load_config(n).hf_model_type for n in preset_names()}
    assert types["llama-3-8b"] == types["llama-3.1-405b"] == "llama"
    assert types["qwen3-30b-a3b"] == "qwen3_moe" and types["qwen3-0.6b"] == "qwen3"
    assert types["openai-gpt2-xl"] == "gpt2" and types["deepseek-v3"] == "deepseek_v3"
    assert types["mistral-7b"] == "mistral" and types["mixtral-8x7b"] == "mixtral"
    assert {types[n] for n in ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")} == {None}
    llama = load_config("llama-3-8b")
    assert dataclasses.replace(llama, hf_model_type=None) == llama
    for name, (values, _) in CONFIGS.items():
        assert config_from_hf(values, name=name).hf_model_type == values.get("model_type"), name
        if name in TYPED:
            assert load_config(name).hf_model_type == values["model_type"], name


@pytest.mark.parametrize("name", TYPED)
def test_every_typed_preset_builds_in_transformers_with_our_parameter_count(name):
    cfg = few_layers(load_config(name))
    assert hf_parameters(cfg) == parameter_breakdown(cfg).total


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in TYPED])
def test_every_committed_config_json_builds_back_with_our_parameter_count(name):
    cfg = few_layers(config_from_hf(CONFIGS[name][0], name=name))
    assert hf_parameters(cfg) == parameter_breakdown(cfg).total


def test_a_config_transformers_cannot_express_is_refused():
    with pytest.raises(ConfigError, match="no hf_model_type"):
        to_hf_dict(load_config("gpt2-small"))
    biased = dataclasses.replace(load_config("llama-3-8b"), qkv_bias=True)  # Llama biases q, k, v and o together
    with pytest.raises(ConfigError, match="output_bias = False cannot be written as a llama config.json"):
        to_hf_dict(biased)
    with pytest.raises(ConfigError, match="hf_model_type must be"):
        dataclasses.replace(load_config("llama-3-8b"), hf_model_type="Llama 3")
