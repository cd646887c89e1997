"""Pipeline parallel beside data parallel: DDP, ZeRO-1 and FSDP2 (ZeRO-2, ZeRO-3), fp32, bf16 and
amp-bf16.  One stage of the real job, torch 2.13's ``PipelineStage`` + ``Schedule1F1B`` over the stage's
model wrapped by DDP (``ZeroRedundancyOptimizer`` for ZeRO-1) or ``fully_shard``, on a (pp, dp) mesh of
the fake process group (``measure.pipeline.measure_stage_rank``: ZeRO-1's worst dp rank, else the
first), against ``analytic.pipeline.stage_step`` (the stage replay: DDP's buckets and ZeRO-1's owned
moments in the baseline; FSDP2's events, ``_StageEvents``, and ``perform_reduce_grad``'s
reduce-scatters, ``_reduce_grads``) and rule 9 of ``analytic.collectives``.

The expected figures are the measured job's; the collective counts are also written out by hand.
Before this replay, the stage estimate under-predicted the FSDP2 peaks by 7 % to 16 %.
"""

import dataclasses
import itertools

import pytest

pytest.importorskip("torch")

from test_pipeline_measured import T5, TINY4, S, _figures  # the same tiny models

from lm_accounting.analytic.collectives import step_collectives, totals
from lm_accounting.analytic.parallel import model_states
from lm_accounting.analytic.pipeline import stage_replayed, stage_step
from lm_accounting.layout import ParallelLayout
from lm_accounting.measure.pipeline import measure_stage_rank
from lm_accounting.setup import TrainingSetup


def _stages(P):
    return sorted({0, P // 2, P - 1})


# every stage type (0, middle, last), m = P and 2P, every ZeRO stage (0: DDP), every precision and
# checkpointing; dp 2 (101 vocabulary rows: the embedding and head shards padded), a stratified sample
PRECISIONS, CHECKPOINTS = ("fp32", "bf16", "amp-bf16"), ("none", "full", "selective")
GRID = [
    (P, k * P, 2, zero, stage, 1, TrainingSetup(precision=p, checkpoint=c))
    for P, k, zero, p, c in itertools.product((2, 4), (1, 2), (0, 1, 2, 3), PRECISIONS, CHECKPOINTS)
    for stage in _stages(P)
][::7]
# dp 4, sdpa at B 2
GRID += [
    (P, 2 * P, 4, zero, stage, 2, TrainingSetup(precision=p, checkpoint=c, attention="sdpa"))
    for P, zero, p, c in itertools.product((2, 4), (0, 1, 2, 3), PRECISIONS, ("none", "selective"))
    for stage in _stages(P)
][::9]


def _id(case):
    P, m, D, zero, stage, B, setup = case
    return f"pp{P}x{m}-dp{D}-zero{zero}-stage{stage}-B{B}-{setup.label}"


def _layout(P, m, D, zero):
    return ParallelLayout(pp=P, micro_batches=m, dp=D, zero=zero)


@pytest.mark.grid
@pytest.mark.parametrize("case", GRID, ids=_id)
def test_stage_beside_data_parallel_is_exact(case):
    P, m, D, zero, stage, B, setup = case
    lay = _layout(P, m, D, zero)
    assert stage_replayed(TINY4, setup, lay)
    got = measure_stage_rank(TINY4, S, B, setup, lay, stage)
    assert _figures(stage_step(TINY4, S, B, setup, lay, stage, mode="traced")[0]) == _figures(got.step)
    st = model_states(TINY4, setup, lay, stage=stage)  # FSDP2: the stage's padded shards; ZeRO-1: its owned moments
    assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)


@pytest.mark.grid
@pytest.mark.parametrize("stage", range(3))
@pytest.mark.parametrize("zero,precision", [(1, "bf16"), (2, "fp32"), (3, "amp-bf16")])
def test_uneven_stages_beside_data_parallel(stage, zero, precision):
    """pp 3 over 5 blocks (2, 2, 1), m = 5 micro-batches, dp 2."""
    setup, lay = TrainingSetup(precision=precision, checkpoint="full"), _layout(3, 5, 2, zero)
    got = measure_stage_rank(T5, S, 1, setup, lay, stage)
    assert _figures(stage_step(T5, S, 1, setup, lay, stage, mode="traced")[0]) == _figures(got.step)


@pytest.mark.slow
@pytest.mark.parametrize("zero,m,stage", [(2, 4, 0), (2, 8, 1), (3, 4, 0), (3, 4, 3), (3, 8, 1), (3, 8, 2)])
def test_collectives_follow_the_schedule(zero, m, stage):
    """Rule 9 against the job's collectives.  By hand: stage s of pp 4 holds one block, plus its root on
    stage 0 (the embedding) and the last (final norm, LM head); ZeRO-2 gathers each unit once, ZeRO-3
    m + 1 times (w = min(m, P − s) warm-up forwards and the m − w + 1 backwards that follow a forward);
    each unit is reduce-scattered once, in ``perform_reduce_grad``."""
    P = 4
    lay, setup = _layout(P, m, 2, zero), TrainingSetup()
    got = measure_stage_rank(TINY4, S, 1, setup, lay, stage).collectives
    units = 1 + (stage in (0, P - 1))
    gathers = 1 if zero == 2 else m + 1
    assert got["all_gather"][0] == gathers * units
    assert got["reduce_scatter"][0] == units
    assert got["all_gather"][1] == gathers * got["reduce_scatter"][1]  # fp32: the same padded bytes
    assert totals(step_collectives(TINY4, S, 1, setup, lay, stage=stage)) == got


def test_ddp_buckets_take_the_last_backwards_all_reduce():
    """DDP beside pipeline parallel: no_sync until the last backward, then one all-reduce of the stage's
    gradients (one bucket in the first step), the RoPE tables broadcast once; by hand for stage 1 of pp 2
    (two blocks, final norm and LM head, fp32)."""
    lay, setup = _layout(2, 4, 2, 0), TrainingSetup()
    got = measure_stage_rank(TINY4, S, 1, setup, lay, 1).collectives
    d, f, V, kv = TINY4.d_model, TINY4.d_ff, TINY4.vocab_size, 12  # kv: 2 kv heads of head_dim 6
    block = 2 * d * d + 2 * kv * d + 3 * d * f + 2 * d  # q, o; k, v; w1, w2, w3; two norms
    assert got["all_reduce"] == (1, (2 * block + d + V * d) * 4)
    assert got["broadcast"] == (1, 2 * 16 * 3 * 4)  # cos and sin, context 16 × head_dim/2, fp32
    assert {k: v for k, v in totals(step_collectives(TINY4, S, 1, setup, lay, first_step=True, stage=1)).items()} == got


def test_amp_residual_stream_crosses_stages_in_bf16():
    """Under FSDP2's bf16 policy a stage's hidden states are bf16 (its bf16 parameters compute them):
    m transfers of B·S·d·2 bytes each way on stage 0 (rule 8's h = 2), as the schedule posts them."""
    lay, setup = _layout(2, 2, 2, 3), TrainingSetup(precision="amp-bf16")
    got = measure_stage_rank(TINY4, S, 1, setup, lay, 0).collectives["send_recv"]
    assert got == (4, 4 * S * TINY4.d_model * 2)
    assert totals(step_collectives(TINY4, S, 1, setup, lay, stage=0))["send_recv"] == got


@pytest.mark.slow
def test_cli_measures_the_stage_of_a_global_rank(run_cli):
    """``memory --pp 2 --dp 2 --zero 3 --rank 3 --measure meta``: global rank 3 is on stage 3 // 2 = 1
    (stages outermost in the (pp, dp) mesh); its measured phases equal the prediction, marked exact."""
    import json

    args = ["memory", "gpt2-small", "--layers", "2", "--set", "tie_embeddings=false", "--context", "32"]
    r = run_cli(*args, "--pp", "2", "--dp", "2", "--zero", "3", "--rank", "3", "--measure", "meta", "--format", "json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["measured"]["rank"] == d["worst_rank"]["pipeline_stage"] == 1
    assert d["peaks_exact"] is True
    assert d["measured"]["step"] == d["step_traced"]
    assert d["measured"]["parameters"] == d["per_gpu"]["parameters"]
    # 2 units on stage 1 (its block and its root: final norm + LM head), gathered m + 1 = 3 times
    assert d["measured"]["collectives"]["all_gather"]["count"] == 6


@pytest.mark.slow
@pytest.mark.parametrize("stage", range(3))
@pytest.mark.parametrize(
    "setup,lay",
    [
        (TrainingSetup(), ParallelLayout(pp=3, micro_batches=5)),
        (TrainingSetup(precision="amp-bf16", checkpoint="full", attention="sdpa"), _layout(3, 3, 2, 3)),
    ],
    ids=["pp3x5", "pp3x3-dp2-zero3-amp-full-sdpa"],
)
def test_stage_flops_equal_the_jobs(stage, setup, lay):
    """``stage_flops`` against the matmul FLOPs of the stage's local ops (``LocalFlops``; the CPU flash
    kernels' formulas installed): m micro-batches of its blocks, the last stage's LM head, full
    checkpointing's recompute and the fused backward's extra QKᵀ.  The stages sum to m steps of the
    whole model, whose LM head the last stage alone runs."""
    from lm_accounting.analytic.hardware_flops import step_flops
    from lm_accounting.analytic.parallel import rank_flops

    B = 2
    got = measure_stage_rank(T5, S, B, setup, lay, stage).local_flops
    assert got == rank_flops(T5, S, B, setup, lay, stage=stage).hardware
    whole = sum(rank_flops(T5, S, B, setup, lay, stage=s).hardware for s in range(3))
    assert whole == lay.micro_batches * step_flops(T5, S, B, setup).hardware


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize(
    "lay,setup",
    [(_layout(2, 2, 1, 0), TrainingSetup()), (_layout(2, 4, 2, 3), TrainingSetup(precision="amp-bf16"))],
    ids=["pp2", "pp2-dp2-zero3-amp"],
)
def test_a_tied_head_is_a_second_copy_on_the_last_stage(stage, lay, setup):
    """Tied embeddings: stage 0 holds the embedding and the last stage the head, one tensor copied to both
    (``PipelineStage`` shares nothing between stages): each stage's states are the untied model's, and
    each phase is exact."""
    tied = dataclasses.replace(TINY4, tie_embeddings=True, name="tied")
    got = measure_stage_rank(tied, S, 1, setup, lay, stage)
    assert _figures(stage_step(tied, S, 1, setup, lay, stage, mode="traced")[0]) == _figures(got.step)
    untied = measure_stage_rank(TINY4, S, 1, setup, lay, stage)
    assert (got.params, got.gradients, got.optimizer) == (untied.params, untied.gradients, untied.optimizer)


def test_a_global_rank_picks_its_stage_and_data_parallel_rank():
    """ZeRO-1's dp ranks own different AdamW moments: ``--rank R`` under pp (a (pp, dp) mesh, stages
    outermost) is stage R // dp and data-parallel rank R mod dp, predicted and measured alike."""
    from lm_accounting.analytic.parallel_report import parallel_memory

    lay, setup = _layout(2, 2, 2, 1), TrainingSetup()
    got = [measure_stage_rank(TINY4, S, 1, setup, lay, 0, dp_rank) for dp_rank in (0, 1)]
    assert got[0].optimizer != got[1].optimizer  # the ranks differ: the test can tell them apart
    for dp_rank, g in enumerate(got):
        want, st, _ = stage_step(TINY4, S, 1, setup, lay, 0, mode="traced", rank=dp_rank)
        assert _figures(want) == _figures(g.step) and st.optimizer == g.optimizer
    for rank in (0, 1):  # stage 0, dp ranks 0 and 1
        m = parallel_memory(TINY4, S, 1, setup, lay, rank=rank)
        assert (m.stage, m.states.rank, m.states.optimizer) == (0, rank, got[rank].optimizer)
