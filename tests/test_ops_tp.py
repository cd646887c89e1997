"""Tensor parallel over transformers' own Llama, Mistral and Qwen3 (``analytic.ops.tp``): one rank of transformers'
own plan (``apply_tensor_parallelism``, as ``from_pretrained(distributed_config=DistributedConfig(tp_size=M))``
applies it) on torch's fake process group (``measure.hf_parallel.measure_hf_rank``): every phase's peak and end and
every collective it records, in order, equal the replay (``ops.predict_step(..., layout=ParallelLayout(tp=M))``);
the states and collectives by hand for the tiny Llama; the refusals are one line."""

import dataclasses
import itertools

import pytest
from test_ops_fsdp import B, S, tiny

from lm_accounting.analytic.ops import predict_step
from lm_accounting.analytic.ops.tp import check_tp, collectives
from lm_accounting.config import AccountingError
from lm_accounting.hf_config import config_from_hf
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

TP2 = ParallelLayout(tp=2)


def test_the_states_of_a_rank_by_hand():
    """tiny("llama") (d 16, 4 heads, 2 kv heads of 4, d_ff 24, vocab 96, 4 layers) at tp 2: a layer holds
    (q 256 + k 128 + v 128 + o 256 + gate, up, down 3·384)/2 + two norms 32 = 992 elements, the root the embedding's
    and the head's 48 rows of 16 (768 each) and the final norm 16: 4·992 + 1,552 = 5,520.  fp32: 12 bytes each
    (parameter, two moments), plus the token ids and labels (2·B·S int64) and the rotary inv_freq and
    original_inv_freq (2 · head_dim/2 fp32); the backward adds a gradient for each (4 · 5,520) and the embedding's
    whole (96, 16) gradient, not its rows: 48·16·4 more."""
    st = predict_step(tiny("llama"), S, TrainingSetup(), impl="transformers", batch=B, layout=TP2).at(B)
    baseline = 12 * 5_520 + 2 * B * S * 8 + 2 * 2 * 4
    assert (st.baseline, st.backward.end, st.optimizer_step.end) == (
        baseline,
        baseline + 4 * 5_520 + 48 * 16 * 4,
        baseline,
    )
    assert baseline == 66_512


def test_the_collectives_by_hand():
    """T = B·S = 16 tokens of d 16: forward, the embedding's all-reduce and two per layer (o, down), T·d·4 bytes
    each, then the logits' all-gather, T·V·4; backward, the head's input gradient, then five per layer (up, gate, v,
    k, q); full checkpointing re-runs each layer's o_proj all-reduce.  amp-bf16: the linears' outputs are bf16."""
    cfg, td = tiny("llama"), 16 * 16
    calls = collectives(cfg, S, B, TrainingSetup(), TP2)
    assert calls[:9] == [("all_reduce", td * 4, "forward")] * 9
    assert calls[9] == ("all_gather", 16 * 96 * 4, "forward")
    assert calls[10:] == [("all_reduce", td * 4, "backward")] * (1 + 5 * 4)
    amp = collectives(cfg, S, B, TrainingSetup(precision="amp-bf16", checkpoint="full"), TP2)
    assert amp[:10] == [("all_reduce", td * 4, "forward")] + [("all_reduce", td * 2, "forward")] * 8 + [
        ("all_gather", 16 * 96 * 2, "forward")
    ]
    layer = [("all_reduce", td * 2, "backward")] + [("all_reduce", td * 4, "backward")] * 5
    assert amp[10:] == [("all_reduce", td * 4, "backward")] + layer * 4


@pytest.mark.parametrize(
    "cfg, layout, match",
    [
        (tiny("llama"), ParallelLayout(tp=2, dp=2, zero=0), "no DDP or ZeRO-1"),
        (tiny("llama"), ParallelLayout(tp=2, pp=2, micro_batches=2), "no --pp"),
        (tiny("llama"), ParallelLayout(tp=2, sequence_parallel=True), "drop --sp"),
        (tiny("llama"), ParallelLayout(tp=4), "kv heads"),
        (tiny("gpt2"), TP2, "not run"),
        (dataclasses.replace(tiny("llama"), vocab_size=95), TP2, "vocab"),
        (dataclasses.replace(tiny("llama"), tie_embeddings=True), ParallelLayout(tp=2, dp=2, zero=3), "tied"),
    ],
    ids=["ddp", "pp", "sp", "kv", "gpt2", "vocab", "tied"],
)
def test_what_is_not_run_is_refused(cfg, layout, match):
    with pytest.raises(ValueError, match=match):
        check_tp(cfg, layout)


# -- against the fake process group ----------------------------------------------------------------------------

pytest.importorskip("transformers")
from lm_accounting.measure.hf_parallel import measure_hf_rank

MISTRAL = dict(model_type="mistral", vocab_size=96, hidden_size=16, num_hidden_layers=2, num_attention_heads=4)
MISTRAL |= dict(num_key_value_heads=2, intermediate_size=24, max_position_embeddings=64, sliding_window=4)
MISTRAL |= dict(tie_word_embeddings=False)
MODELS = {
    "llama": lambda: tiny("llama"),
    "llama-kv4": lambda: dataclasses.replace(tiny("llama"), num_kv_heads=4),  # tp 4 divides its kv heads
    "qwen3": lambda: tiny("qwen3", layers=2),
    "mistral": lambda: config_from_hf(MISTRAL),  # Mistral's sliding window: its own mask
}


def check(name: str, setup: TrainingSetup, tp: int, dp: int = 1, zero: int = 0) -> None:
    """Rank 0 of the job on real CPU tensors (as our own TP's: FakeTensors change its transient peaks): every phase
    and every collective; beside FSDP2 (``dp``, ``zero``), the TP plan's all-reduces in order and its logits'
    all-gather among FSDP2's all-gathers."""
    cfg, layout = MODELS[name](), ParallelLayout(tp=tp, dp=dp, zero=zero)
    calls: list = []
    got = measure_hf_rank(cfg, S, B, setup, layout, fake=False, collectives=calls)
    assert predict_step(cfg, S, setup, impl="transformers", batch=B, layout=layout).at(B) == got
    want = collectives(cfg, S, B, setup, layout)
    if dp == 1:
        assert calls == want
        return
    assert [c for c in calls if c[0] == "all_reduce"] == [c for c in want if c[0] == "all_reduce"]
    assert next(c for c in want if c[0] == "all_gather") in calls


SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c)
    for a, p, c in itertools.product(("naive", "sdpa"), ("fp32", "bf16", "amp-bf16"), ("none", "full"))
]


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
def test_llama_tp2_equals_transformers_on_the_fake_process_group(setup):
    check("llama", setup, 2)


@pytest.mark.slow
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
def test_llama_tp4_equals_transformers_on_the_fake_process_group(setup):
    check("llama-kv4", setup, 4)


@pytest.mark.parametrize("name", ["qwen3", "mistral"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(), TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")],
    ids=lambda s: s.label,
)
def test_qwen3_and_mistral_equal_transformers(name, setup):
    check(name, setup, 2)


def test_the_measurement_refuses_in_one_line():
    with pytest.raises(AccountingError, match="no DDP or ZeRO-1"):
        measure_hf_rank(tiny("llama"), S, B, TrainingSetup(), ParallelLayout(tp=2, dp=2, zero=1), fake=False)


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
def test_llama_tp2_beside_fsdp2_zero3_equals_the_fake_process_group(setup):
    """FSDP2 (``fully_shard`` on each layer, then the root) over the dp dimension of the (dp 2, tp 2) mesh after
    transformers' TP plan."""
    check("llama", setup, 2, dp=2, zero=3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, setup, tp, dp, zero",
    [
        ("llama", TrainingSetup(precision="amp-bf16", checkpoint="full"), 2, 2, 2),
        ("llama", TrainingSetup(attention="sdpa", precision="bf16"), 2, 2, 2),
        ("llama", TrainingSetup(attention="sdpa", precision="amp-bf16"), 2, 4, 3),
        ("llama-kv4", TrainingSetup(precision="amp-bf16", checkpoint="full"), 4, 2, 3),
        ("qwen3", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"), 2, 2, 3),
        ("mistral", TrainingSetup(), 2, 2, 2),
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v),
)
def test_tp_beside_fsdp2_equals_the_fake_process_group(name, setup, tp, dp, zero):
    check(name, setup, tp, dp=dp, zero=zero)
