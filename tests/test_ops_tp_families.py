"""transformers' own tensor parallel over the families beyond Llama, Mistral and Qwen3 (``analytic.ops.tp.TP_PLANS``),
and over a tied embedding and head: rank 0 of the fake-PG job (``measure.hf_parallel.measure_hf_rank``, transformers'
``apply_tensor_parallelism`` as ``from_pretrained(distributed_config=DistributedConfig(tp_size=M))`` applies it, the
head tied after, as ``_finalize_model_loading`` ties it) on real CPU tensors: every phase's peak and end and every
collective, in order, equal the replay.  The configs are the zoo's (``test_ops_transformers_zoo.ZOO``: d 32, 4 heads,
2 KV heads, d_ff 64, vocab 96) at S = 12, past the 10-key windows."""

import dataclasses
import itertools

import pytest

pytest.importorskip("transformers")
from test_ops_fsdp import tiny as tiny_llama
from test_ops_transformers_zoo import LLAMA_LIKE, ZOO

from lm_accounting.analytic.ops import predict_step
from lm_accounting.analytic.ops.tp import check_tp, collectives
from lm_accounting.config import AccountingError
from lm_accounting.hf_config import config_from_hf
from lm_accounting.layout import ParallelLayout
from lm_accounting.measure.hf_parallel import measure_hf_rank
from lm_accounting.setup import TrainingSetup

S, B = 12, 2
MORE = {
    "qwen2": LLAMA_LIKE,  # q/k/v biases: colwise, so sharded with their weights
    "cohere": {**LLAMA_LIKE, "logit_scale": 0.0625},  # the parallel block, tied
    "cohere2": {**LLAMA_LIKE, "logit_scale": 0.25, "sliding_window": 10, "sliding_window_pattern": 2},
}
FAMILIES = [
    "qwen2",
    "granite",  # the multipliers: the embedding's and the logits' scale on the reduced and gathered tensors
    "olmo",  # weightless LayerNorms
    "starcoder2",  # c_fc / c_proj, biases on every linear (rowwise ones replicated)
    "gemma",  # tied, the scaled embedding
    "gemma2",  # tied, sandwich norms: the recompute re-runs both rowwise all-reduces
    "gemma3_text",  # per-head q/k norms after all three projections
    "vaultgemma",
    "cohere",
    "cohere2",
    "exaone4",  # post-norms, q/k norms after the projections
    "hyperclovax",  # Granite's with post-norms
    "ministral",
    "ministral3",
    "smollm3",  # tied, NoPE layers
    "helium",
    "ernie4_5",  # tied, biases
    "seed_oss",  # o_proj's own bias (rowwise: replicated)
    "iquestcoder",
]
EAGER_ONLY = ("gemma2", "vaultgemma")  # transformers refuses sdpa (soft-capping)


def family(name: str, tp: int = 2, **fields):
    """The zoo's tiny config of ``name`` (4 KV heads at tp 4, so that tp divides them)."""
    kv = {"num_key_value_heads": 4} if tp == 4 else {}
    return config_from_hf({"model_type": name, **(MORE.get(name) or ZOO[name]), **kv, **fields})


def check(cfg, setup: TrainingSetup, layout: ParallelLayout) -> None:
    """Every phase of rank 0 and every collective (beside FSDP2: the TP plan's all-reduces in order)."""
    calls: list = []
    got = measure_hf_rank(cfg, S, B, setup, layout, fake=False, collectives=calls)
    assert predict_step(cfg, S, setup, impl="transformers", batch=B, layout=layout).at(B) == got
    want = collectives(cfg, S, B, setup, layout)
    if layout.dp == 1:
        assert calls == want
    else:
        assert [c for c in calls if c[0] == "all_reduce"] == [c for c in want if c[0] == "all_reduce"]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_equals_transformers(name):
    check(family(name), TrainingSetup(), ParallelLayout(tp=2))


SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c)
    for a, p, c in itertools.product(("naive", "sdpa"), ("fp32", "amp-bf16"), ("none", "full"))
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", FAMILIES)
def test_family_grid(name, tp, setup):
    """Every family × tp 2, 4 × eager, sdpa × fp32, amp-bf16 × none, full (sampled: ``--grid``)."""
    if name in EAGER_ONLY and setup.attention == "sdpa":
        setup = dataclasses.replace(setup, attention="naive")
    check(family(name, tp), setup, ParallelLayout(tp=tp))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, setup, tp, dp, zero",
    [
        ("qwen2", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"), 2, 2, 3),
        ("starcoder2", TrainingSetup(), 2, 2, 2),
        ("granite", TrainingSetup(attention="sdpa", precision="bf16"), 2, 2, 3),
        ("exaone4", TrainingSetup(precision="amp-bf16", checkpoint="full"), 2, 2, 3),
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v),
)
def test_families_beside_fsdp2(name, setup, tp, dp, zero):
    """FSDP2 over the dp dimension of the (dp, tp) mesh after the plan (untied: a tied head is refused there)."""
    check(family(name, tp, tie_word_embeddings=False), setup, ParallelLayout(tp=tp, dp=dp, zero=zero))


# -- a tied embedding and head ------------------------------------------------------------------------------------


def test_a_tied_head_by_hand():
    """tiny Llama (d 16, vocab 96, 4 layers of 992 local elements at tp 2, ``test_ops_tp``) tied: the head is the
    embedding's Shard(0) parameter (48 rows of 16), so the states lose the head's 768 elements: 12·(5,520 − 768)
    bytes, plus the ids, labels and rotary buffers (256 + 16).  The backward ends with one gradient per parameter,
    the shared one's rows only: the head's (48, 16) gradient, then the embedding's whole (96, 16) one added to
    those rows; the collectives are the untied head's."""
    cfg = dataclasses.replace(tiny_llama("llama"), tie_embeddings=True)
    st = predict_step(cfg, 8, TrainingSetup(), impl="transformers", batch=2, layout=ParallelLayout(tp=2)).at(2)
    baseline = 12 * (5_520 - 768) + 2 * 2 * 8 * 8 + 2 * 2 * 4
    assert (st.baseline, st.backward.end, st.optimizer_step.end) == (baseline, baseline + 4 * (5_520 - 768), baseline)
    untied = dataclasses.replace(cfg, tie_embeddings=False)
    assert collectives(cfg, 8, 2, TrainingSetup(), ParallelLayout(tp=2)) == collectives(
        untied, 8, 2, TrainingSetup(), ParallelLayout(tp=2)
    )


@pytest.mark.parametrize(
    "setup", [TrainingSetup(), TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")], ids=str
)
def test_a_tied_qwen3_equals_transformers(setup):
    """Qwen3-0.6B's shape of tie (q/k norms), tiny: transformers shards the untied model, then ties the head to
    the embedding's DTensor."""
    cfg = dataclasses.replace(tiny_llama("qwen3", layers=2), tie_embeddings=True)
    check(cfg, setup, ParallelLayout(tp=2))


@pytest.mark.slow
def test_a_tied_llama_tp4_equals_transformers():
    cfg = dataclasses.replace(tiny_llama("llama"), num_kv_heads=4, tie_embeddings=True)
    check(cfg, TrainingSetup(precision="bf16", checkpoint="full"), ParallelLayout(tp=4))


# -- what is not run ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, layout, match",
    [
        (family("qwen2", tie_word_embeddings=True), ParallelLayout(tp=2, dp=2, zero=3), "tied .* beside FSDP2"),
        (family("cohere", use_qk_norm=True), ParallelLayout(tp=2), "q/k norms' weights whole"),
        (config_from_hf({"model_type": "olmo2", **LLAMA_LIKE}), ParallelLayout(tp=2), "olmo2 is not run"),
        (config_from_hf({"model_type": "phi3", **ZOO["phi3"]}), ParallelLayout(tp=2), "phi3 is not run"),
    ],
    ids=["tied-fsdp", "cohere-qk", "olmo2", "phi3"],
)
def test_what_is_not_run_is_refused(cfg, layout, match):
    with pytest.raises(ValueError, match=match):
        check_tp(cfg, layout)
    with pytest.raises(AccountingError, match=match):
        measure_hf_rank(cfg, S, B, TrainingSetup(), layout, fake=False)
