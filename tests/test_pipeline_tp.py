"""Pipeline parallel beside tensor parallel (Megatron splits, with or without sequence parallel), alone
or with FSDP2: one stage of the real job on a (pp, dp, tp) mesh of the fake process group
(``measure.pipeline.measure_stage_rank``: the stage's model pruned, then ``parallelize_module``, then
``fully_shard``), against ``analytic.pipeline.stage_step`` (the stage replay of the TP-local model;
under sequence parallel the rank's T/M-row residual stream, its all-gathers and reduce-scatters) and
rules 8–10 of ``analytic.collectives``.

Exact in every precision, with or without sequence parallel: without it, a row-parallel output's
all-reduce can set the forward peak of a stage without the LM head (``replay._tp_all_reduce``; before it
was replayed, up to T·d·a low there: 576 to 3,072 bytes on this grid, in fp32 and amp-bf16).  The
expected figures are the measured job's.
"""

import dataclasses
import itertools

import pytest

pytest.importorskip("torch")

from test_pipeline_measured import T5, TINY4, S, _figures  # the same tiny models

from lm_accounting.analytic.collectives import step_collectives, totals
from lm_accounting.analytic.parallel import local_config, model_states, rank_flops
from lm_accounting.analytic.pipeline import stage_replayed, stage_step
from lm_accounting.layout import ParallelLayout
from lm_accounting.measure.pipeline import measure_stage_rank
from lm_accounting.setup import TrainingSetup

PRECISIONS, CHECKPOINTS = ("fp32", "bf16", "amp-bf16"), ("none", "full", "selective")
DATA = ((1, 0), (2, 2), (2, 3))  # (dp, zero): TP alone, beside FSDP2 ZeRO-2 and ZeRO-3

GRID = [
    (P, k * P, D, zero, sp, stage, B, TrainingSetup(precision=p, checkpoint=c, attention=att))
    for P, k, (D, zero), sp, p, c, (att, B) in itertools.product(
        (2, 4), (1, 2), DATA, (False, True), PRECISIONS, CHECKPOINTS, (("naive", 1), ("sdpa", 2))
    )
    for stage in sorted({0, P // 2, P - 1})
][::11]


def _id(case, vp=False):
    P, m, D, zero, sp, stage, B, setup = case
    return f"pp{P}x{m}-dp{D}-zero{zero}-tp2{'+sp' if sp else ''}{'+vp' if vp else ''}-stage{stage}-B{B}-{setup.label}"


CASES = [pytest.param(c, vp, id=_id(c, vp)) for vp, cases in ((False, GRID), (True, GRID[1::2])) for c in cases]


@pytest.mark.grid
@pytest.mark.parametrize("case,vp", CASES)
def test_stage_beside_tensor_parallel(case, vp):
    """``vp``: vocab parallel too (the row-wise embedding on stage 0, the column-wise head and
    ``loss_parallel`` on the last stage: 51 of the 101 rows on TP rank 0)."""
    P, m, D, zero, sp, stage, B, setup = case
    lay = ParallelLayout(pp=P, micro_batches=m, dp=D, zero=zero, tp=2, sequence_parallel=sp, vocab_parallel=vp)
    assert stage_replayed(TINY4, setup, lay)
    got = measure_stage_rank(TINY4, S, B, setup, lay, stage)
    want = stage_step(TINY4, S, B, setup, lay, stage, mode="traced")[0]
    st = model_states(TINY4, setup, lay, stage=stage)
    assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert _figures(want) == _figures(got.step)


@pytest.mark.grid
@pytest.mark.parametrize("stage", range(3))
@pytest.mark.parametrize(
    "lay,setup",
    [
        (ParallelLayout(pp=3, micro_batches=4, tp=2, sequence_parallel=True), TrainingSetup(checkpoint="full")),
        (
            ParallelLayout(pp=3, micro_batches=4, dp=2, zero=3, tp=2, sequence_parallel=True),
            TrainingSetup(precision="amp-bf16", checkpoint="full"),
        ),
        (ParallelLayout(pp=3, micro_batches=4, dp=2, zero=2, tp=2), TrainingSetup(precision="bf16")),
        (
            ParallelLayout(pp=3, micro_batches=4, dp=2, zero=3, tp=2, sequence_parallel=True, vocab_parallel=True),
            TrainingSetup(precision="amp-bf16", checkpoint="full"),
        ),
    ],
    ids=["tp2+sp", "dp2-zero3-tp2+sp-amp", "dp2-zero2-tp2-bf16", "dp2-zero3-tp2+sp+vp-amp"],
)
def test_uneven_stages_collectives_and_flops(stage, lay, setup):
    """pp 3 over 5 blocks (2, 2, 1): each phase exact, every collective's count and bytes equal the job's
    (rules 8–10: per step, the stage's blocks; SP's LM-head gather on the last stage, its embedding-
    gradient gather on stage 0; FSDP2's norm reductions in fp32 under amp beside pp), and the stage's
    local matmul FLOPs equal ``stage_flops`` of the TP-local model."""
    got = measure_stage_rank(T5, S, 1, setup, lay, stage)
    assert _figures(stage_step(T5, S, 1, setup, lay, stage, mode="traced")[0]) == _figures(got.step)
    assert totals(step_collectives(T5, S, 1, setup, lay, first_step=True, stage=stage)) == got.collectives
    assert got.local_flops == rank_flops(T5, S, 1, setup, lay, stage=stage).hardware
    assert got.local_flops < rank_flops(T5, S, 1, setup, ParallelLayout(pp=3, micro_batches=4), stage=stage).hardware
    assert local_config(T5, lay).num_heads == 2


def test_sequence_parallel_stages_pass_their_positions_share():
    """Rule 8 under sequence parallel, by hand: m = 4 micro-batches of S/M = 8 positions × d = 24 fp32 each
    way on stage 0 of pp 2 (sends forward, receives the gradients)."""
    lay = ParallelLayout(pp=2, micro_batches=4, tp=2, sequence_parallel=True)
    got = measure_stage_rank(TINY4, S, 1, TrainingSetup(), lay, 0).collectives["send_recv"]
    assert got == (8, 8 * (S // 2) * TINY4.d_model * 4)


@pytest.mark.slow
def test_vocab_parallel_stages_add_its_collectives():
    """Rule 7 beside pipeline parallel, by hand, from the measured jobs with and without vocab parallel
    (pp 2, m = 4 micro-batches of T = 16 positions, d = 24, fp32, TP 2): stage 0 adds the row-wise
    embedding's all-reduce, m of T·d·4 = 1,536 bytes; the last stage adds the loss's three all-reduces per
    micro-batch (T·(4 + 4 + 4): the row max, Σ exp and the target logit) and the column-wise head's input
    gradient, m of T·d·4."""
    plain, vp = (ParallelLayout(pp=2, micro_batches=4, tp=2, vocab_parallel=v) for v in (False, True))
    extra = []
    for stage in (0, 1):
        a, b = (measure_stage_rank(TINY4, S, 1, TrainingSetup(), lay, stage).collectives for lay in (plain, vp))
        extra.append(tuple(x - y for x, y in zip(b["all_reduce"], a.get("all_reduce", (0, 0)), strict=True)))
        assert b == totals(step_collectives(TINY4, S, 1, TrainingSetup(), vp, first_step=True, stage=stage))
    assert extra == [(4, 4 * 16 * 24 * 4), (4 * 3 + 4, 4 * 16 * 12 + 4 * 16 * 24 * 4)]


BIG_VOCAB = dataclasses.replace(TINY4, vocab_size=2000, name="tiny4-v2000")  # 1,000 rows a TP rank
ADAMW_LAYOUTS = [
    ParallelLayout(pp=2, micro_batches=2, tp=2, sequence_parallel=True, vocab_parallel=True),
    ParallelLayout(pp=2, micro_batches=2, dp=2, zero=1),
    ParallelLayout(pp=2, micro_batches=2, dp=2, zero=3, tp=2, vocab_parallel=True),
]


@pytest.mark.grid
@pytest.mark.parametrize("optimizer", ["fused", "foreach", "for-loop"])
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("lay", ADAMW_LAYOUTS, ids=lambda lay: lay.label)
def test_every_adamw_implementation_on_a_stage(lay, stage, optimizer):
    """A stage's AdamW as one GPU's (``parallel.adamw_temporary``): fused keeps the stage's step counters on
    the device (4 bytes a tensor; ZeRO-1: the owned ones; before, left out of the stage's baseline: 76 and
    80 bytes low), stage 0 redistributes vocab parallel's whole embedding gradient (its 1,000 rows, which
    set the step's peak there) and the stages their norms' Partial gradients.  Every phase exact."""
    setup = TrainingSetup(optimizer=optimizer)
    got = measure_stage_rank(BIG_VOCAB, S, 1, setup, lay, stage).step
    assert _figures(got) == _figures(stage_step(BIG_VOCAB, S, 1, setup, lay, stage, mode="traced")[0])


def test_stage_zero_adamw_clones_the_vocab_parallel_embedding_rows():
    """By hand: stage 0 of pp 2 beside TP 2 + vocab parallel, V = 2,000, d = 24, fp32, foreach AdamW.  Its
    embedding gradient is the whole (V, d), replicated, beside the Shard(0) parameter, and
    ``addcmul_(v, g, g)`` redistributes it twice at once: two clones of its 1,000 rows, 2·1,000·24·4 =
    192,000 B above the backward's end, more than the sqrt's copy of every v (no LM head on stage 0)."""
    lay = ParallelLayout(pp=2, micro_batches=2, tp=2, vocab_parallel=True)
    got = measure_stage_rank(BIG_VOCAB, S, 1, TrainingSetup(), lay, 0).step
    assert got.optimizer_step.peak - got.backward.end == 2 * 1000 * 24 * 4
    assert stage_step(BIG_VOCAB, S, 1, TrainingSetup(), lay, 0, mode="traced")[0].optimizer_step == got.optimizer_step


@pytest.mark.slow
def test_cli_measures_a_tensor_parallel_stage(run_cli):
    """``memory --pp 2 --tp 2 --sp --measure meta --rank 2``: global rank 2 is stage 2 // 2 = 1 (the mesh
    is (pp, tp)); measured equals predicted, marked exact."""
    import json

    args = ["memory", "gpt2-small", "--layers", "2", "--set", "tie_embeddings=false", "--context", "32"]
    r = run_cli(*args, "--pp", "2", "--tp", "2", "--sp", "--rank", "2", "--measure", "meta", "--format", "json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["measured"]["rank"] == d["worst_rank"]["pipeline_stage"] == 1
    assert d["peaks_exact"] is True
    assert d["measured"]["step"] == d["step_traced"]
    assert d["measured"]["local_matmul_flops"] == d["flops"]["hardware"]
