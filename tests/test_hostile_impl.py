"""Regressions from a hostile tester's findings on ``--impl transformers`` (issue 26, H11's F3, F7, F12, F14).

* F7: a class default token id outside a vocabulary shrunk with ``--vocab-size`` (Phi-3's pad 32,000) made
  ``nn.Embedding`` assert: ``to_hf_dict`` writes no token ids, and the command measures.
* F3: GPT-2 measured at a context shorter than its 1,024 positions was refused: the position table
  (``n_positions``) is the model's, the context is the step's sequence.
* F14: a Gemma 3 with fewer layers than its full-attention period (6) was refused ("builds None").
* F12: AdamW's step counters of transformers' GPT-2 were counted from our model's 196 tensors, not
  GPT2LMHeadModel's 148; every model type's tensors are compared with transformers' real model on meta.
"""

import dataclasses
import json

import pytest

from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes
from lm_accounting.analytic.memory import adamw_step_counter_bytes, adamw_step_temporary_bytes
from lm_accounting.config import ConfigError, load_config
from lm_accounting.hf_config import config_from_hf, to_hf_dict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_measure_hf import CONFIGS, TYPED, few_layers


def built(cfg):
    values = to_hf_dict(cfg)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


ALL = [("preset", n) for n in TYPED] + [("config.json", n) for n in CONFIGS if n not in TYPED]


def config_of(kind, name):
    return load_config(name) if kind == "preset" else config_from_hf(CONFIGS[name][0], name=name)


@pytest.mark.parametrize(("kind", "name"), ALL)
def test_transformers_tensors_are_those_of_its_real_model(kind, name):
    """numel of every parameter tensor in ``model.parameters()`` order, and their count, equal transformers'
    real model (on meta) for every typed preset and committed config.json, untied and tied."""
    cfg = few_layers(config_of(kind, name))
    for c in (cfg, dataclasses.replace(cfg, tie_embeddings=not cfg.tie_embeddings)):
        real = [p.numel() for p in built(c).parameters()]
        assert hf_parameter_tensor_sizes(c) == real, (name, c.tie_embeddings)
        assert hf_parameter_tensor_count(c) == len(real), (name, c.tie_embeddings)


def test_gpt2_step_counters_are_gpt2lmheadmodels_148_tensors():
    """GPT-2 small: wte, wpe, 12 blocks of 12 tensors (4 LayerNorm, fused c_attn, c_proj, c_fc, mlp.c_proj,
    each a weight and a bias), ln_f's 2, the head tied: 2 + 144 + 2 = 148 tensors, 4 bytes each on the cpu.
    Ours has separate q, k, v weights and biases: 4 more tensors a block, 196."""
    cfg = load_config("openai-gpt2")
    assert adamw_step_counter_bytes(cfg, "foreach", "cpu", implementation="transformers") == 148 * 4
    assert adamw_step_counter_bytes(cfg, "foreach", "cpu") == 196 * 4
    assert adamw_step_counter_bytes(cfg, "fused", "cuda", implementation="transformers") == 148 * 4
    assert adamw_step_counter_bytes(cfg, "foreach", "cuda", implementation="transformers") == 0


def test_phi3_for_loop_temporaries_follow_the_fused_tensors():
    """The for-loop AdamW holds max(previous + 2·current) elements: for Phi-3 mini (d 3,072, F 8,192, vocab
    32,064, untied) the largest tensor pair is the head after the final norm: 3,072 + 2·32,064·3,072 (its fused
    gate_up, 16,384·3,072, is smaller than the embedding)."""
    cfg = few_layers(config_from_hf(CONFIGS["phi-3-mini-4k"][0], name="phi3"))
    head = 32_064 * 3_072
    assert adamw_step_temporary_bytes(cfg, "fp32", "for-loop", implementation="transformers") == 4 * (3_072 + 2 * head)
    # a model where the fused gate_up is the largest: vocabulary 16
    small = dataclasses.replace(cfg, vocab_size=16)
    gate_up, down = 2 * 8_192 * 3_072, 3_072 * 8_192
    qkv = 3 * 3_072 * 3_072
    expected = max(qkv + 2 * gate_up, gate_up + 2 * down)
    assert adamw_step_temporary_bytes(small, "fp32", "for-loop", implementation="transformers") == 4 * expected


def test_a_token_id_outside_a_shrunk_vocabulary_builds():
    """Phi-3's class default pad_token_id is 32,000: at vocabulary 1,024 nn.Embedding refused it (F7)."""
    cfg = dataclasses.replace(few_layers(load_config_json("phi-3-mini-4k")), vocab_size=1024)
    values = to_hf_dict(cfg)
    assert values["pad_token_id"] is None and values["bos_token_id"] is None and values["eos_token_id"] is None
    assert sum(p.numel() for p in built(cfg).parameters()) == sum(hf_parameter_tensor_sizes(cfg))


def load_config_json(name):
    return config_from_hf(CONFIGS[name][0], name=name)


def test_gpt2_keeps_its_position_table_at_a_shorter_context():
    """F3: n_positions is the model's table (1,024), the context the step's sequence (256)."""
    cfg = load_config("openai-gpt2").with_context(256)
    values = to_hf_dict(cfg)
    assert values["n_positions"] == 1024
    assert built(cfg).transformer.wpe.weight.shape == (1024, 768)


def test_gemma3_with_fewer_layers_than_its_period_windows_every_layer():
    """F14: a 2-layer Gemma 3 (full attention every 6th layer) has two sliding layers."""
    cfg = dataclasses.replace(load_config_json("gemma-3-1b"), num_layers=2)
    assert to_hf_dict(cfg)["layer_types"] == ["sliding_attention", "sliding_attention"]
    assert built(cfg).config.layer_types == ["sliding_attention", "sliding_attention"]


def test_what_the_class_cannot_express_is_still_refused():
    """The round trip still names a field transformers' class cannot take (Llama biases q, k, v and o together)."""
    biased = dataclasses.replace(load_config("llama-3-8b"), qkv_bias=True).with_context(512)
    with pytest.raises(ConfigError, match="output_bias = False cannot be written"):
        to_hf_dict(biased)


@pytest.fixture
def config_json(tmp_path):
    def write(name):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(CONFIGS[name][0]))
        return path

    return write


@pytest.mark.parametrize(
    ("source", "args"),
    [
        ("phi-3-mini-4k", ["--layers", 2, "--context", 64, "--vocab-size", 1024]),  # F7
        ("openai-gpt2", ["--impl", "transformers", "--layers", 2, "--context", 64]),  # F3
        ("gemma-3-1b", ["--layers", 2, "--context", 64, "--vocab-size", 512]),  # F14
    ],
)
def test_the_findings_commands_measure_and_equal_the_prediction(run_cli, config_json, source, args):
    """Each finding's command (at a smaller shape) exits 0 with the measured step equal to the traced prediction
    on meta, phase by phase (it was a traceback or a one-line refusal)."""
    model = source if source in TYPED else config_json(source)
    result = run_cli("memory", model, *args, "--measure", "meta", "--format", "json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    predicted, measured = data["implementation_exact"]["step_traced"], data["measured"]
    for phase in ("forward", "backward", "optimizer_step"):
        assert measured[phase] == predicted[phase], phase
    assert measured["baseline"] == predicted["baseline"]


def test_the_account_counts_transformers_step_counters():
    """F12 through the account the memory command prints: GPT-2 small's 148 tensors with fused AdamW on cuda
    (592 bytes), ours 196 (784 bytes)."""
    from lm_accounting.analytic.program_report import implementation_account
    from lm_accounting.setup import TrainingSetup

    cfg, setup = load_config("openai-gpt2"), TrainingSetup(optimizer="fused")
    for impl, tensors in (("transformers", 148), ("course", 196)):
        account = implementation_account(cfg, 1024, 1, impl=impl, setup=setup, device="cuda")
        assert account.step_counters == 4 * tensors, impl
