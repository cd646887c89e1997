"""transformers' dense models added to the op library for issue 26 (``DENSE``: gpt_bigcode) replayed by their
programs (``analytic.ops.transformers.PROGRAMS``) equal transformers' own models measured by the storage tracker
on meta, phase by phase, byte for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``), and the plain
CPU run equals the CPU allocator's events (``test_ops_transformers_zoo.check_plain``).

The configs are small config.json objects read by ``hf_config.config_from_hf`` (the class defaults fill the rest:
GPTBigCode's 0.1 dropouts and multi-query attention)."""

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

from lm_accounting.measure.hf import measure_hf_step

DENSE = {
    # GPTBigCode: GPT-2's model with nn.Linear projections, one K/V head (multi_query, its default), gelu_pytorch_tanh
    "gpt_bigcode": dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
}


def tiny(model_type: str, **fields):
    return config_from_hf({"model_type": model_type, **DENSE[model_type], **fields})


SETUPS = [
    TrainingSetup(attention="naive", precision="bf16"),
    TrainingSetup(attention="sdpa", checkpoint="full"),
    TrainingSetup(attention="sdpa", precision="amp-bf16"),
]
"""eager/sdpa x checkpointing none/full x fp32/bf16/amp-bf16, three of the twelve."""


def label(setup: TrainingSetup) -> str:
    return "-".join(setup.to_dict().values())


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"multi_query": False},
        {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "activation_function": "gelu_new"},
        {"tie_word_embeddings": False, "n_inner": 48},
    ],
    ids=["mqa-dropout", "mha", "no-dropout-gelu_new", "untied"],
)
@pytest.mark.parametrize("setup", SETUPS, ids=label)
def test_gpt_bigcode_equals_transformers(fields, setup):
    """GPTBigCode: GPT-2's model with nn.Linear projections, multi-query attention (one K/V head split off the fused
    ``c_attn``, repeated by eager, ``enable_gqa`` in sdpa's math path with dropout), or per-head splits without it,
    the class's 0.1 dropouts or none (sdpa's flash kernel), against its class on meta and the plain run against the
    CPU allocator."""
    cfg = tiny("gpt_bigcode", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


def test_gpt_bigcode_dropouts_at_any_probability_are_modelled():
    """GPTBigCode's three dropouts are replayed at the config.json's probability (the class's 0.1 where left out):
    none is refused, and a step at 0.2 equals transformers' (the same noise tensors as at 0.1)."""
    cfg = tiny("gpt_bigcode", attn_pdrop=0.2, resid_pdrop=0.0)
    assert unsupported(cfg, TrainingSetup(), "transformers") == []
    setup = TrainingSetup(attention="sdpa", precision="bf16")
    lines = predict_step(cfg, 12, setup, impl="transformers", batch=2)
    assert lines.at(2) == measure_hf_step(cfg, 12, 2, setup, device="meta")


def test_refusals_name_what_is_not_transliterated():
    for model_type in DENSE:
        cfg = tiny(model_type)
        assert unsupported(cfg, TrainingSetup(attention="naive"), "transformers") == []
        assert unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers")
