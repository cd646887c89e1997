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


def _id(case):
    P, m, D, zero, sp, stage, B, setup = case
    return f"pp{P}x{m}-dp{D}-zero{zero}-tp2{'+sp' if sp else ''}-stage{stage}-B{B}-{setup.label}"


@pytest.mark.parametrize("case", GRID, ids=_id)
def test_stage_beside_tensor_parallel(case):
    P, m, D, zero, sp, stage, B, setup = case
    lay = ParallelLayout(pp=P, micro_batches=m, dp=D, zero=zero, tp=2, sequence_parallel=sp)
    assert stage_replayed(TINY4, setup, lay)
    got = measure_stage_rank(TINY4, S, B, setup, lay, stage)
    want = stage_step(TINY4, S, B, setup, lay, stage, mode="traced")[0]
    st = model_states(TINY4, setup, lay, stage=stage)
    assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert _figures(want) == _figures(got.step)


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
    ],
    ids=["tp2+sp", "dp2-zero3-tp2+sp-amp", "dp2-zero2-tp2-bf16"],
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
