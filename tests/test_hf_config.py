"""Reading a Hugging Face config.json (lm_accounting.hf_config): the mapping rules, the traps, and one-line
exit-2 errors for every bad input.  transformers itself is the ground truth in test_transformers_truth.py."""

import json
import os

import pytest

from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ConfigError, is_config_path, load_config
from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES, config_from_hf
from lm_accounting.hf_refusals import REFUSED_MODEL_TYPES

LLAMA = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_llama_3_8b_from_its_config_json(tmp_path):
    (tmp_path / "Meta-Llama-3-8B").mkdir()
    cfg = load_config(write(tmp_path / "Meta-Llama-3-8B", {**LLAMA, "bos_token_id": 128000, "torch_dtype": "bf16"}))
    assert cfg.name == "Meta-Llama-3-8B" and parameter_breakdown(cfg).total == 8_030_261_248
    assert cfg.ignored_fields == ("bos_token_id", "torch_dtype") and cfg.course_architecture
    assert {k: v for k, v in cfg.resolved().items() if k not in ("name", "ignored_fields")} == {
        k: v for k, v in load_config("llama-3-8b").resolved().items() if k not in ("name", "ignored_fields")
    }
    assert is_config_path("config.json") and is_config_path("x/CONFIG.JSON")


def test_defaults_when_fields_are_absent():
    base = {k: v for k, v in LLAMA.items() if k not in ("num_key_value_heads", "tie_word_embeddings", "rope_theta")}
    cfg = config_from_hf(base)
    assert cfg.kv_heads == 32 and not cfg.tie_embeddings and cfg.rope_theta == 10_000.0  # LlamaConfig defaults
    gpt2 = config_from_hf(
        {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024}
    )
    assert gpt2.tie_embeddings and gpt2.d_ff == 4 * 768 and parameter_breakdown(gpt2).total == 124_439_808
    gpt2_inner = config_from_hf(
        {
            "model_type": "gpt2",
            "vocab_size": 50257,
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_positions": 1024,
            "n_inner": None,
        }
    )
    assert gpt2_inner.d_ff == 3072
    # transformers v5 nests rope_theta in rope_parameters; its other entries (scaling) are listed as ignored
    v5 = config_from_hf({**base, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}})
    assert v5.rope_theta == 500000.0 and v5.ignored_fields == ("rope_parameters.rope_type", "rope_parameters.factor")


def test_model_type_implies_the_architecture():
    common = {k: v for k, v in LLAMA.items() if k != "model_type"}
    qwen3 = config_from_hf({**common, "model_type": "qwen3", "head_dim": 128})
    assert qwen3.qk_norm and qwen3.qk_norm_scope == "head" and not qwen3.qkv_bias
    qwen2 = config_from_hf({**common, "model_type": "qwen2"})
    assert qwen2.qkv_bias and not qwen2.output_bias and not qwen2.qk_norm
    olmo = config_from_hf({**common, "model_type": "olmo2"})
    assert olmo.norm_placement == "post" and olmo.qk_norm_scope == "projection"
    del common["tie_word_embeddings"]  # absent: Gemma's default is tied
    gemma2 = config_from_hf({**common, "model_type": "gemma2", "sliding_window": 4096})
    assert (gemma2.norm_placement, gemma2.mlp, gemma2.scale_embeddings, gemma2.tie_embeddings) == (
        "sandwich",
        "geglu",
        True,
        True,
    )
    assert (gemma2.sliding_window, gemma2.full_attention_every, gemma2.qk_norm) == (4096, 2, False)
    gemma3 = config_from_hf({**common, "model_type": "gemma3_text", "sliding_window": 512})
    assert gemma3.full_attention_every == 6 and gemma3.qk_norm and gemma3.windowed_layers == 32 - 5
    mistral = config_from_hf({**common, "model_type": "mistral", "sliding_window": 4096})
    assert mistral.windowed_layers == 32 and mistral.full_attention_every is None
    assert config_from_hf({**common, "model_type": "mistral", "sliding_window": None}).sliding_window is None
    phi3 = config_from_hf({**common, "model_type": "phi3"})
    assert phi3.course_architecture


def test_layer_types_follow_the_window_rule():
    common = {**LLAMA, "model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 64}
    lt = ["sliding_attention", "full_attention"] * 2
    assert config_from_hf({**common, "layer_types": lt}).full_attention_every == 2
    all_sliding = config_from_hf({**common, "model_type": "mistral", "layer_types": ["sliding_attention"] * 4})
    assert all_sliding.windowed_layers == 4 and all_sliding.full_attention_every is None
    assert config_from_hf({**common, "layer_types": ["full_attention"] * 4}).sliding_window is None
    with pytest.raises(ConfigError, match="field 'layer_types' is not understood"):
        config_from_hf({**common, "layer_types": ["full_attention", "sliding_attention"] * 2})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**LLAMA, "model_type": "bert"}, "model_type 'bert' has an encoder or encoder-decoder model"),
        ({**LLAMA, "model_type": "no_such_type"}, "unsupported model_type 'no_such_type' (supported: gpt2, llama"),
        ({**LLAMA, "model_type": "mixtral"}, "missing required field 'num_local_experts' (model_type 'mixtral')"),
        ({**LLAMA, "model_type": "qwen3_moe"}, "missing required field 'num_experts' (model_type 'qwen3_moe')"),
        ({**LLAMA, "model_type": "qwen2_moe"}, "missing required field 'num_experts' (model_type 'qwen2_moe')"),
        ({**LLAMA, "model_type": "mixtral", "num_local_experts": None}, "'num_local_experts' must be an integer"),
        (
            {**LLAMA, "model_type": "deepseek_v3", "num_key_value_heads": 32, "n_routed_experts": None},
            "field 'n_routed_experts' must be an integer, got None",  # not silently V3's 256
        ),
        (
            {**LLAMA, "model_type": "deepseek_v3", "num_key_value_heads": 32, "kv_lora_rank": None},
            "field 'kv_lora_rank' must be an integer, got None",
        ),
        (
            {**LLAMA, "model_type": "deepseek_v3", "num_key_value_heads": 32, "n_shared_experts": None},
            "field 'n_shared_experts' must be an integer >= 0, got None",
        ),
        ({**LLAMA, "model_type": "deepseek_v3"}, "'num_key_value_heads' must equal num_attention_heads"),
        (
            {**LLAMA, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3},
            "experts_per_token=3 exceeds num_experts=2",
        ),
        (
            {**LLAMA, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0]},
            "field 'mlp_only_layers' is not supported",
        ),
        (
            {**LLAMA, "model_type": "deepseek_v3", "num_key_value_heads": 32, "head_dim": 128},
            "field 'head_dim' = 128 must be qk_rope_head_dim (64)",
        ),
        (
            {**LLAMA, "model_type": "deepseek_v3", "num_key_value_heads": 32, "first_k_dense_replace": -1},
            "field 'first_k_dense_replace' must be an integer >= 0",
        ),
        (
            {**LLAMA, "model_type": "deepseek_v2", "num_key_value_heads": 32},
            "missing required field 'num_experts_per_tok' (model_type 'deepseek_v2')",  # its class default: None
        ),
        ({k: v for k, v in LLAMA.items() if k != "model_type"}, "missing required field 'model_type'"),
        ({k: v for k, v in LLAMA.items() if k != "hidden_size"}, "missing required field 'hidden_size'"),
        ({**LLAMA, "model_type": 3}, "field 'model_type' must be a string"),
        ({**LLAMA, "hidden_size": "4096"}, "field 'hidden_size' must be an integer, got '4096'"),
        ({**LLAMA, "hidden_size": 4096.0}, "field 'hidden_size' must be an integer, got 4096.0"),
        ({**LLAMA, "num_hidden_layers": True}, "field 'num_hidden_layers' must be an integer"),
        ({**LLAMA, "num_hidden_layers": 0}, "field 'num_hidden_layers' must be between 1 and 10^18"),
        ({**LLAMA, "tie_word_embeddings": "no"}, "field 'tie_word_embeddings' must be true or false"),
        ({**LLAMA, "rope_theta": "big"}, "field 'rope_theta' must be a number"),
        (
            {**LLAMA, "per_layer_config": {"0": {"intermediate_size": 8}}},
            "field 'per_layer_config' is not understood for model_type 'llama' (transformers' LlamaConfig defines it",
        ),
        ({**LLAMA, "hidden_act": "relu"}, "field 'hidden_act' = 'relu' is not supported"),
        ({"model_type": "gpt2", "n_embd": 8, "n_layer": 2, "n_head": 2}, "missing required field 'n_positions'"),
        (
            {"model_type": "gpt2", "n_embd": 8, "hidden_size": 16},
            "fields 'hidden_size' and 'n_embd' are two names for one setting",
        ),
        (
            {
                **LLAMA,
                "model_type": "qwen2",
                "use_sliding_window": True,
                "sliding_window": 4096,
                "max_window_layers": 28,
            },
            "field 'use_sliding_window' = true is not supported",
        ),
        ({**LLAMA, "model_type": "phi3", "partial_rotary_factor": 0.75}, "'partial_rotary_factor' = 0.75"),
        ({**LLAMA, "num_key_value_heads": 5}, "num_heads=32 is not divisible by num_kv_heads=5"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_config_json_is_one_line(data, message):
    with pytest.raises(ConfigError) as err:
        config_from_hf(data, "cfg.json")
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("cfg.json: ")


def test_every_supported_type_and_the_later_ones_are_listed():
    assert set(SUPPORTED_MODEL_TYPES) >= {
        "gpt2",
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo2",
        "deepseek_v2",
        "deepseek_v3",
        "gpt_oss",
        "qwen2_moe",
        "olmo",
        "bloom",
        "ernie4_5_moe",
        "cohere",
        "cohere2",
        "phi",
        "gpt_neox",
        "gptj",
        "falcon",
    }
    assert "qwen2_moe" not in REFUSED_MODEL_TYPES and "gpt_oss" not in REFUSED_MODEL_TYPES


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"model_type": "llama", "hidden_size": NaN}', "non-standard JSON constant NaN"),
        (
            (
                '{"model_type": "llama", "vocab_size": 32, "hidden_size": Infinity, "intermediate_size": 64, '
                '"num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 16}'
            ),
            "'hidden_size'",
        ),
        ("[" * 100_000 + "]" * 100_000, "JSON"),
        ("", "not valid JSON"),
    ],
)
def test_cli_bad_files_exit_2_with_one_line(run_cli, tmp_path, content, message):
    path = write(tmp_path, content)
    r = run_cli(str(path))
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1


def test_cli_file_checks_are_the_toml_ones(run_cli, tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20))
    folder = tmp_path / "dir.json"
    folder.mkdir()
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    binary = write(tmp_path, "", "bin.json")
    binary.write_bytes(b"\xff\xfe{}")
    for path, message in (
        (big, "too large"),
        (folder, "is a directory, not a JSON file"),
        (fifo, "not a regular file (a FIFO); give a JSON file"),
        (tmp_path / "missing.json", "no such file"),
        (binary, "not a UTF-8 text file"),
    ):
        r = run_cli(str(path))
        assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, (path, r.err)


def test_cli_reads_a_config_json_and_reports_the_ignored_fields(run_cli, tmp_path):
    path = write(tmp_path, {**LLAMA, "attention_dropout": 0.0, "bos_token_id": 1})
    r = run_cli(str(path), "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["parameters"]["total"] == 8_030_261_248
    assert data["config"]["ignored_fields"] == ["attention_dropout", "bos_token_id"]
    bad = run_cli(str(write(tmp_path, {**LLAMA, "model_type": "falcon_x"}, "f.json")))
    assert bad.code == 2 and "unsupported model_type 'falcon_x'" in bad.err and "olmo2" in bad.err
    known = run_cli(str(write(tmp_path, {**LLAMA, "model_type": "codegen"}, "g.json")))
    assert known.code == 2 and "model_type 'codegen' has attention and MLP in parallel" in known.err
