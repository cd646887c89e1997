"""transformers' parallel-block models replayed by the op library (``analytic.ops.transformers``: ``cohere``
for Cohere and Cohere2, ``gpt_neox``, ``phi``, ``gptj``) equal transformers' own models measured by the storage
tracker on meta, phase by phase, byte for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``); Falcon's
program is proven in tests/test_ops_transformers_dense_zoo.py; phi-2's dropout gives model states, the reason said.  A narrow MLP under full checkpointing moves the
forward peak into the attention of a block's first (unsaved) forward, where every local the modeling code keeps
counts (``test_a_narrow_mlp_under_checkpointing_equals_transformers``).

The configs are small config.json objects read by ``hf_config.config_from_hf``; the published shapes are in
tests/test_arch_parallel_block.py.
"""

import json

import pytest

from lm_accounting.hf_config import config_from_hf

pytest.importorskip("transformers")
from test_arch_parallel_block import CONFIGS, FALCON_7B, PHI_2, PYTHIA_160M

COHERE_TINY = dict(
    model_type="cohere", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "setup"),
    [
        ({}, dict(attention="naive", precision="fp32")),
        ({"use_qk_norm": True}, dict(attention="sdpa", precision="bf16")),
        ({"use_qk_norm": True, "tie_word_embeddings": False}, dict(attention="naive", precision="bf16")),
        ({"attention_bias": True}, dict(attention="sdpa", checkpoint="full")),
        ({}, dict(attention="naive", checkpoint="full", precision="bf16")),
        ({"use_qk_norm": True}, dict(attention="sdpa", precision="amp-bf16")),
    ],
)
def test_cohere_step_equals_transformers_on_meta(fields, setup):
    """The training step of ``CohereForCausalLM`` (one-norm parallel block, bias-free LayerNorms in fp32,
    interleaved RoPE in fp32, q/k norms with a gain per head, the scaled logits), replayed without torch, equals
    transformers' own model measured by the storage tracker on meta, phase by phase, byte for byte, at B = 1,
    2 and 3 (``test_ops_transformers_llama.check``)."""
    from test_ops_transformers_llama import check

    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    cfg = config_from_hf({**COHERE_TINY, **fields})
    setup = TrainingSetup(**setup)
    assert unsupported(cfg, setup, "transformers") == []
    check(cfg, 8, setup)


@pytest.mark.parametrize(
    ("fields", "setup", "seq"),
    [
        ({}, dict(attention="naive", precision="fp32"), 12),
        ({}, dict(attention="sdpa", precision="bf16"), 12),
        ({"sliding_window_pattern": 4, "num_hidden_layers": 5}, dict(attention="naive", precision="bf16"), 8),
        ({}, dict(attention="sdpa", checkpoint="full"), 12),
        ({"sliding_window_pattern": 4, "num_hidden_layers": 5}, dict(attention="sdpa", precision="amp-bf16"), 12),
    ],
)
def test_cohere2_step_equals_transformers_on_meta(fields, setup, seq):
    """``Cohere2ForCausalLM``: both masks every forward, RoPE on the windowed layers only; a window of 10 keys,
    S = 12 past it (the windowed mask made), S = 8 short of it; at B = 1, 2 and 3 on meta."""
    from test_ops_transformers_llama import check

    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    values = {**COHERE_TINY, "model_type": "cohere2", "num_hidden_layers": 4, "sliding_window": 10}
    cfg = config_from_hf({**values, "sliding_window_pattern": 2, **fields})
    setup = TrainingSetup(**setup)
    assert unsupported(cfg, setup, "transformers") == []
    check(cfg, seq, setup)


NEOX_TINY = dict(
    model_type="gpt_neox", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=4, max_position_embeddings=64,
)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "setup"),
    [
        ({}, dict(attention="naive", precision="fp32")),
        ({}, dict(attention="sdpa", precision="bf16")),
        ({"use_parallel_residual": False, "rotary_pct": 1.0}, dict(attention="naive", precision="bf16")),
        ({"attention_bias": False, "rotary_pct": 0.5}, dict(attention="sdpa", checkpoint="full")),
        ({"tie_word_embeddings": True}, dict(attention="naive", checkpoint="full", precision="bf16")),
        ({}, dict(attention="sdpa", precision="amp-bf16")),
    ],
)
def test_gpt_neox_step_equals_transformers_on_meta(fields, setup):
    """The training step of ``GPTNeoXForCausalLM`` (the fused ``query_key_value`` chunked per head, partial RoPE
    concatenated back, exact GELU, the two-norm parallel block or the sequential one), replayed without torch,
    equals transformers' own model measured on meta at B = 1, 2 and 3."""
    from test_ops_transformers_llama import check

    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    cfg = config_from_hf({**NEOX_TINY, **fields})
    setup = TrainingSetup(**setup)
    assert unsupported(cfg, setup, "transformers") == []
    check(cfg, 8, setup)


PHI_TINY = dict(
    model_type="phi", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=4, max_position_embeddings=64,
)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "setup"),
    [
        ({}, dict(attention="naive", precision="fp32")),
        ({}, dict(attention="sdpa", precision="bf16")),
        ({"partial_rotary_factor": 1.0, "hidden_act": "gelu", "num_key_value_heads": 2}, dict(attention="naive")),
        ({"qk_layernorm": True, "tie_word_embeddings": True}, dict(attention="sdpa", checkpoint="full")),
        ({"qk_layernorm": True}, dict(attention="naive", precision="bf16")),
        ({}, dict(attention="sdpa", precision="amp-bf16")),
    ],
)
def test_phi_step_equals_transformers_on_meta(fields, setup):
    """The training step of ``PhiForCausalLM`` (biased projections, sliced partial RoPE, gelu_new or F.gelu, the
    one-norm parallel block, q/k LayerNorms, the LM head's bias), replayed without torch, equals transformers' own
    model measured on meta at B = 1, 2 and 3."""
    from test_ops_transformers_llama import check

    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    cfg = config_from_hf({**PHI_TINY, **fields})
    setup = TrainingSetup(**setup)
    assert unsupported(cfg, setup, "transformers") == []
    check(cfg, 8, setup)


GPTJ_TINY = dict(model_type="gptj", vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=64, rotary_dim=4)


@pytest.mark.parametrize(
    ("fields", "setup"),
    [
        ({}, dict(attention="naive", precision="fp32")),
        ({}, dict(attention="sdpa", precision="bf16")),
        ({"rotary_dim": 8, "activation_function": "gelu", "n_inner": 48}, dict(attention="naive", precision="bf16")),
        ({"tie_word_embeddings": True}, dict(attention="sdpa", checkpoint="full")),
        ({}, dict(attention="naive", precision="amp-bf16")),
        ({}, dict(attention="sdpa", precision="amp-bf16")),
    ],
)
def test_gptj_step_equals_transformers_on_meta(fields, setup):
    """The training step of ``GPTJForCausalLM`` (the n_positions × rotary_dim table indexed per forward, RoPE before
    the heads are transposed with repeat-interleaved sin and cos, q and k cast to fp32 for the scores, k/v/q/out
    without biases, the LM head's bias), replayed without torch, equals transformers' own model on meta."""
    from test_ops_transformers_llama import check

    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    cfg = config_from_hf({**GPTJ_TINY, **fields})
    setup = TrainingSetup(**setup)
    assert unsupported(cfg, setup, "transformers") == []
    check(cfg, 8, setup)


NARROW = {  # an MLP narrower than the attention's tensors
    "cohere": {**COHERE_TINY, "intermediate_size": 16, "use_qk_norm": True},
    "gpt_neox": {**NEOX_TINY, "intermediate_size": 16, "use_parallel_residual": False, "rotary_pct": 0.5},
    "phi": {**PHI_TINY, "intermediate_size": 16, "qk_layernorm": True, "num_key_value_heads": 2},
    "gptj": {**GPTJ_TINY, "n_inner": 16},
}


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_a_narrow_mlp_under_checkpointing_equals_transformers(name, attention):
    from test_ops_transformers_llama import check

    from lm_accounting.setup import TrainingSetup

    check(config_from_hf(NARROW[name]), 12, TrainingSetup(attention=attention, checkpoint="full", precision="bf16"))


def test_other_parallel_blocks_are_model_states_only_by_name():
    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.setup import TrainingSetup

    phi_2 = unsupported(config_from_hf(PHI_2), TrainingSetup(), "transformers")
    assert phi_2 == ["dropout of resid_pdrop 0.1 (the config.json's: transformers applies it in training)"]
    for name in ("falcon-7b", "falcon-40b"):  # the falcon program (tests/test_ops_transformers_dense_zoo.py)
        for attention in ("naive", "sdpa"):
            assert unsupported(config_from_hf(CONFIGS[name]), TrainingSetup(attention=attention), "transformers") == []


def test_memory_is_model_states_only_with_the_reason(run_cli, tmp_path):
    """transformers' phi-2 (its config.json's ``resid_pdrop`` 0.1, which the phi program does not model): the memory
    command gives model states only and says why; Falcon-7B's step is predicted (the falcon program); our own
    model of Pythia (``--impl course``) is replayed."""
    path = tmp_path / "phi-2" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(PHI_2))
    result = run_cli("memory", path, "--impl", "transformers", "-S", "256")
    assert result.code == 0, result.err
    assert "model states only" in result.out and "dropout of resid_pdrop 0.1" in result.out
    path = tmp_path / "falcon-7b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(FALCON_7B))
    result = run_cli("memory", path, "--impl", "transformers", "-S", "256", "--attention", "sdpa")
    assert result.code == 0 and "model states only" not in result.out, result.out
    path = tmp_path / "pythia-160m" / "config.json"  # Phi's LM-head bias is not in the course program yet
    path.parent.mkdir()
    path.write_text(json.dumps(PYTHIA_160M))
    result = run_cli("memory", path, "--impl", "course", "-S", "256")
    assert result.code == 0 and "model states only" not in result.out, result.out


@pytest.mark.parametrize(
    ("values", "setup"),
    [
        ({**NEOX_TINY, "num_hidden_layers": 5}, dict(attention="naive", precision="amp-bf16", checkpoint="full")),
        ({**PHI_TINY, "num_hidden_layers": 5}, dict(attention="sdpa", precision="bf16")),
        ({**GPTJ_TINY, "n_layer": 5}, dict(attention="naive", checkpoint="full")),
        ({**COHERE_TINY, "num_hidden_layers": 5}, dict(attention="sdpa", precision="amp-bf16")),
    ],
    ids=["gpt_neox", "phi", "gptj", "cohere"],
)
def test_five_layers_replay_the_middle_run_once(values, setup):
    """Five layers: the middle three replayed once for all (``LlamaForCausalLM.run_layers``), against every layer of
    transformers' model on meta at B = 1, 2 and 3."""
    from test_ops_transformers_llama import check

    from lm_accounting.setup import TrainingSetup

    check(config_from_hf(values), 8, TrainingSetup(**setup))
