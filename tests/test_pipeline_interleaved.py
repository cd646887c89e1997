"""Interleaved 1F1B (``ParallelLayout.virtual_stages``): the layout and torch's refusals, the schedule's
order against torch 2.13's own ``ScheduleInterleaved1F1B``, the bubble and the v-fold transfers the
planner prices (by hand), and one pipeline rank of the real job (v ``PipelineStage``s under
``ScheduleInterleaved1F1B`` on the fake process group, ``measure.pipeline.measure_interleaved_rank``):

* with pipeline parallel alone, ``analytic.pipeline.interleaved_rank_step`` replays it: every phase's
  peak and end byte-exact (pp 2 and 4, v 2, m = pp and 2·pp, every rank of pp 2 and ranks 0, 1 and 3 of
  pp 4, fp32 and amp-bf16, no and full checkpointing; bf16, selective checkpointing and sdpa at B 2 on a
  few; every rank of uneven splits, pp 3, m not a multiple of pp, v 3 and 4; fused and for-loop AdamW and a
  tied head), the expected figures the measured rank's;
* beside DDP, ZeRO-1 and TP (with or without SP and vocab parallel) the same, at B 2, with the collectives
  and the matmul FLOPs;
* beside FSDP2 the replay (along the runtime's UNSHARD, RESHARD and REDUCE_GRAD actions: at most 3 chunks
  unsharded at once, torch 2.13's ``_add_unshard_reshard``) equals the measured ranks' baseline, phases, states
  and collectives, v 2 and 3 and v 4 to 8 (chunks resharded and gathered again), ZeRO-2 and -3;
* ``interleaved_rank_estimate`` (what stands where nothing is replayed): its model states, baseline, the
  backward's and optimizer step's ends and the sends exact on the measured ranks; its peaks an estimate
  (their error printed by ``test_estimate_error_is_reported`` and the FSDP2 test, not asserted)."""

import dataclasses
import itertools

import pytest

from lm_accounting.analytic.collectives import step_collectives, totals
from lm_accounting.analytic.pipeline import (
    interleaved_order,
    interleaved_rank_estimate,
    interleaved_rank_step,
    pipeline_slots,
    pipeline_stages,
    stage_floor,
    stage_replayed,
)
from lm_accounting.config import AccountingError, ModelConfig
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

TINY4 = ModelConfig(
    vocab_size=101, context_length=16, num_layers=4, d_model=24, num_heads=4, num_kv_heads=2, d_ff=40, name="tiny4"
)
TINY8 = ModelConfig(
    vocab_size=101, context_length=16, num_layers=8, d_model=24, num_heads=4, num_kv_heads=2, d_ff=40, name="tiny8"
)
S = 16


# -- the layout ------------------------------------------------------------------------------------


def test_a_rank_holds_every_pp_th_stage():
    """torch's "loop" mapping (``generate_stage_to_rank_mapping``): stage i on rank i mod pp."""
    lay = ParallelLayout(pp=4, micro_batches=8, virtual_stages=2)
    assert lay.stages == 8 and lay.world == 4
    assert [lay.chunks(r) for r in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.label == "dp1·zero0·pp4x8v2"
    assert lay.to_dict()["virtual_stages"] == 2 and ParallelLayout().to_dict()["virtual_stages"] == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"virtual_stages": 2}, "need pipeline parallel"),
        ({"pp": 4, "micro_batches": 9, "virtual_stages": 2}, "2 rounds"),  # 9 // 4 = 2 rounds; 9 mod 2 = 1
        ({"pp": 4, "micro_batches": 14, "virtual_stages": 2}, "3 rounds"),  # 14 // 4 = 3; 14 mod 3 = 2
        ({"pp": 2, "micro_batches": 1, "virtual_stages": 2}, "at least 2 micro-batches"),
        ({"pp": 2, "micro_batches": 2, "virtual_stages": 0}, "positive integer"),
    ],
)
def test_layouts_torch_refuses(kwargs, message):
    with pytest.raises(AccountingError, match=message):
        ParallelLayout(**kwargs)


@pytest.mark.parametrize("m", [4, 5, 6, 7, 8, 10, 12, 16])
def test_micro_batch_counts_torch_takes(m):
    """pp 4: rounds = max(1, m // 4) divides m (m = 5, 6, 7: one round of m)."""
    assert ParallelLayout(pp=4, micro_batches=m, virtual_stages=2).micro_batches == m


def test_more_stages_than_layers_are_refused():
    with pytest.raises(AccountingError, match="8 stages exceed the 4 layers"):
        ParallelLayout(pp=4, micro_batches=4, virtual_stages=2).check(TINY4)
    ParallelLayout(pp=2, micro_batches=2, virtual_stages=2).check(TINY4)


def test_cli_refuses_in_one_line(run_cli):
    for args, text in (
        (["--virtual-stages", "2"], "need pipeline parallel"),
        (["--pp", "4", "--virtual-stages", "4"], "16 stages exceed the 12 layers"),
        (["--pp", "4", "--virtual-stages", "2", "--micro-batches", "9"], "ScheduleInterleaved1F1B refuses"),
    ):
        r = run_cli("memory", "gpt2-small", *args)
        assert r.code == 2 and text in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_more_stages_than_layers_refused_at_every_entry(run_cli, monkeypatch):
    """pp 4 × v 4 = 16 stages of gpt2-small's 12 layers, beside FSDP2 (where ``_interleaved_first_backward`` had
    raised "max() arg is an empty sequence", a ValueError traceback) and alone (a chunk of 0 layers: "num_layers
    must be positive"): every command that takes a layout, and the analytic entries, refuse it in one line
    (``AccountingError``, exit 2) before anything is replayed or built (the replay's parts patched to fail)."""
    import lm_accounting.analytic.pipeline as pl

    def built(*a, **k):
        raise AssertionError("replayed before the refusal")

    monkeypatch.setattr(pl, "_interleaved_first_backward", built)
    monkeypatch.setattr(pl, "_stage_parts", built)
    monkeypatch.setattr(pl, "interleaved_rank_estimate", built)
    text = "16 stages exceed the 12 layers"
    for extra in ([], ["--dp", "2", "--zero", "3"], ["--dp", "2", "--zero", "2", "--tp", "2", "--vocab-parallel"]):
        lay = ["--pp", "4", "--virtual-stages", "4", *extra]
        for args in (
            ["memory", "gpt2-small", "-S", "64", *lay],
            ["memory", "gpt2-small", "-S", "64", "--measure", "meta", *lay],
            ["train-time", "gpt2-small", "-S", "64", *lay],
            ["plan", "gpt2-small", "-S", "64", "--tokens", "10000000", "--gpus", "8..64", *lay],
        ):
            r = run_cli(*args)
            assert r.code == 2 and text in r.err and len(r.err.strip().splitlines()) == 1, (args, r.err)
    gpt2 = ModelConfig(vocab_size=101, context_length=64, num_layers=12, d_model=24, num_heads=4, d_ff=40, name="g")
    setup = TrainingSetup()
    for kw in ({}, {"dp": 2, "zero": 3}, {"dp": 2, "zero": 2, "tp": 2, "vocab_parallel": True}):
        lay = ParallelLayout(pp=4, micro_batches=4, virtual_stages=4, **kw)
        for entry, rank in (
            (interleaved_rank_step, (0,)),
            (pipeline_stages, ()),
            (stage_floor, ()),
            (pl.stage_step, (0,)),
        ):
            with pytest.raises(AccountingError, match=text):
                entry(gpt2, 64, 1, setup, lay, *rank)
    lay = ParallelLayout(pp=4, micro_batches=4, virtual_stages=3)  # 12 stages of 12 layers: a rank beyond pp
    with pytest.raises(AccountingError, match="pipeline rank 4 is outside the 4 ranks"):
        interleaved_rank_step(gpt2, 64, 1, setup, lay, 4)


# -- the schedule's order, against torch's ---------------------------------------------------------


def _torch_order(pp: int, v: int, m: int, rank: int) -> list[tuple[bool, int]]:
    """torch 2.13's own compute actions of ``rank`` (``_calculate_single_rank_operations``, which reads only
    these attributes: no process group needed)."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    assert torch.__version__.startswith("2.13")
    s = object.__new__(ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = pp, v, m
    s.number_of_rounds = max(1, m // pp)
    s.microbatches_per_round = m // s.number_of_rounds
    ops = [a for a in s._calculate_single_rank_operations(rank) if a is not None]
    assert all(a.stage_index % pp == rank for a in ops)
    return [(a.computation_type == _ComputationType.FORWARD, a.stage_index // pp) for a in ops]


@pytest.mark.parametrize("pp, v, m", [(2, 2, 2), (2, 2, 4), (4, 2, 4), (4, 2, 8), (4, 3, 6), (4, 4, 10), (8, 2, 16)])
def test_order_is_torchs(pp, v, m):
    for rank in range(pp):
        assert interleaved_order(pp, v, m, rank) == _torch_order(pp, v, m, rank)


# -- the time model --------------------------------------------------------------------------------


def test_bubble_slots_by_hand():
    """Narayanan et al. 2021 §2.2.2: k micro-batches, pp stages, v chunks: (k·v + pp − 1)/v slots of one
    micro-batch's time on the busiest rank; bubble fraction (pp − 1)/(v·k)."""
    assert pipeline_slots(8, 4) == 11  # 1F1B: k + pp − 1
    assert pipeline_slots(8, 4, 2) == 9.5  # (16 + 3)/2
    assert pipeline_slots(4, 4, 4) == 4.75  # (16 + 3)/4
    assert pipeline_slots(8, 1) == 8
    k, pp, v = 8, 4, 2
    assert (pipeline_slots(k, pp, v) - k) / k == (pp - 1) / (v * k)


def test_plan_prices_the_step_of_a_small_layout_by_hand():
    """pp 2 over TINY4's 4 blocks: 1F1B's stage 0 holds blocks 0, 1 and the embedding; interleaved with v 2
    rank 0 holds chunks 0 and 2 (blocks 0 and 2, the embedding), the last rank chunks 1 and 3 (blocks 1 and
    3, the head): the busiest rank's matmul FLOPs per micro-batch are the same, so the compute is slots × the
    micro-batch's time plus the same AdamW step: (2k + 1)/2 slots against k + 1.  The transfers: 1F1B's ranks send and receive m each
    way; interleaved, rank 0's chunk 0 has one neighbour and chunk 2 two: 3m each way, T·d·4 bytes each
    (amp-bf16 without FSDP2: the fp32 residual stream), over NVLink (2 GPUs, one node)."""
    from lm_accounting.gpus import gpu
    from lm_accounting.plan import price_layout

    setup, b, k = TrainingSetup(precision="amp-bf16"), 1, 2  # naive attention: flash pads TINY4's head_dim 6
    one = price_layout(TINY4, "h100-80gb", S, b, setup, ParallelLayout(pp=2, micro_batches=k))
    two = price_layout(TINY4, "h100-80gb", S, b, setup, ParallelLayout(pp=2, micro_batches=k, virtual_stages=2))
    four = price_layout(TINY4, "h100-80gb", S, b, setup, ParallelLayout(pp=2, micro_batches=2 * k))
    # compute = slots · t + the AdamW step a: 1F1B k + 1 = 3 slots, interleaved (2k + 1)/2 = 2.5, 1F1B at 2k 5
    t = 2 * (one[0] - two[0])  # 3 − 2.5 = half a micro-batch's time
    assert t > 0 and four[0] - one[0] == pytest.approx(2 * t, rel=1e-9)
    nvlink = gpu("h100-80gb").interconnect_one_way
    assert one[3] == pytest.approx(2 * k * b * S * TINY4.d_model * 4 / nvlink, rel=1e-12)
    assert two[3] == pytest.approx(2 * 3 * k * b * S * TINY4.d_model * 4 / nvlink, rel=1e-12)


def test_a_chunk_without_a_block_runs_the_head_alone_by_hand():
    """More chunks than blocks (the Llama 3 paper's layout: a first chunk of the embedding alone, a last of the head
    alone; priced, never replayed): pp 2 × v 4 over TINY4's 4 blocks, ``stage_layers`` giving chunks 0-3 a block
    each and 4-7 none.  Rank 0 (chunks 0, 2, 4, 6) runs blocks 0 and 2; rank 1 (chunks 1, 3, 5, 7) blocks 1 and
    3 and, in chunk 7, the LM head.  Forward matmul FLOPs of one micro-batch of T = S tokens, written out (d 24,
    4 heads of 6, 2 KV heads, d_ff 40, vocabulary 101; naive attention over the full square):
    q and o 2·T·24·24 each, k and v 2·T·24·12 each, QKᵀ and AV 2·S²·24 each, the SwiGLU 3 · 2·T·24·40; the head
    2·T·24·101.  No checkpointing: nothing recomputed."""
    from lm_accounting.analytic.parallel import rank_flops

    m, T = 8, S
    block = 2 * (2 * T * 24 * 24) + 2 * (2 * T * 24 * 12) + 2 * (2 * S * S * 24) + 3 * (2 * T * 24 * 40)
    head = 2 * T * 24 * 101
    lay = ParallelLayout(pp=2, micro_batches=m, virtual_stages=4)
    setup = TrainingSetup(precision="amp-bf16")
    first, last = (rank_flops(TINY4, S, 1, setup, lay, 0, r) for r in (0, 1))
    assert (first.forward, first.recompute, first.attention_recompute) == (m * 2 * block, 0, 0)
    assert (last.forward, last.recompute, last.attention_recompute) == (m * (2 * block + head), 0, 0)


def test_plan_enumerates_virtual_stages():
    """``plan`` tries v = 2 beside v = 1 where pp·v stages have a block each, and only with pp (2 GPUs: pp 2
    alone, or beside dp or tp 2 on 4 GPUs)."""
    from lm_accounting.plan import plan

    hd8 = ModelConfig(  # TINY4 with head_dim 8: plan prices sdpa, whose CUDA flash kernel pads head_dim 6
        vocab_size=101, context_length=16, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2, d_ff=40, name="hd8"
    )
    p = plan(hd8, "h100-80gb", (2, 4), S, 8 * S, 8 * S * 100, top=10**6)
    seen = {(c.layout.pp, c.layout.virtual_stages) for c in p.ranked}
    assert (2, 2) in seen and (2, 1) in seen and (1, 1) in seen
    assert all(c.layout.virtual_stages == 1 or c.layout.pp > 1 for c in p.ranked)
    # replayed (exact) alone and beside DDP, ZeRO-1, FSDP2 and TP; an estimate beside DDP / ZeRO-1 × TP only
    interleaved = [c for c in p.ranked if c.layout.virtual_stages > 1]
    assert any(c.layout.fsdp and c.layout.dp > 1 for c in interleaved)
    assert all(c.peak_exact == (c.layout.tp == 1 or c.layout.dp == 1 or c.layout.zero >= 2) for c in interleaved)


# -- one pipeline rank of the real job -------------------------------------------------------------

PRECISIONS, CHECKPOINTS = ("fp32", "amp-bf16"), ("none", "full")
GRID = [
    (P, k * P, rank, 1, TrainingSetup(precision=p, checkpoint=c))
    for P, k, p, c in itertools.product((2, 4), (1, 2), PRECISIONS, CHECKPOINTS)
    for rank in (range(2) if P == 2 else (0, 1, 3))
]
MORE = [  # pure bf16, selective checkpointing, sdpa at B 2
    (2, 4, rank, B, TrainingSetup(precision=p, checkpoint=c, attention=a))
    for rank in (0, 1)
    for p, c, a, B in (("bf16", "none", "naive", 1), ("bf16", "selective", "naive", 1), ("amp-bf16", "full", "sdpa", 2))
]


def _cfg(P):
    return TINY4 if P == 2 else TINY8  # pp·v stages of one block or more


def _id(case):
    P, m, rank, B, setup = case
    return f"pp{P}x{m}v2-rank{rank}-B{B}-{setup.label}"


@pytest.fixture(scope="module")
def measured():
    return {}


def _measure(cache, case):
    from lm_accounting.measure.pipeline import measure_interleaved_rank

    if case not in cache:
        P, m, rank, B, setup = case
        lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=2)
        cache[case] = measure_interleaved_rank(_cfg(P), S, B, setup, lay, rank)
    return cache[case]


def _figures(step):
    return (step.baseline, *(x for phase in step.phases().values() for x in phase))


@pytest.mark.parametrize("case", GRID + MORE, ids=_id)
def test_interleaved_rank_step_is_exact(case, measured):
    """Every phase's peak and end (forward: to the rank's first backward of any chunk; backward: the rest
    of the schedule; the chunks' AdamW steps + zero_grad) equals the measured rank's."""
    torch = pytest.importorskip("torch")
    assert torch.__version__.startswith("2.13")
    P, m, rank, B, setup = case
    lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=2)
    assert stage_replayed(_cfg(P), setup, lay)
    got = _measure(measured, case).step
    assert _figures(interleaved_rank_step(_cfg(P), S, B, setup, lay, rank, "traced")[0]) == _figures(got)
    assert stage_floor(_cfg(P), S, B, setup, lay) <= pipeline_stages(_cfg(P), S, B, setup, lay)[1].peak


def test_interleaved_replay_sees_the_schedule(measured):
    """The figures move with what the replay models: another rank, micro-batch count or precision gives
    other bytes (the equality above is not a tautology of the measured run's shape)."""
    case = (4, 8, 1, 1, TrainingSetup(precision="amp-bf16", checkpoint="full"))
    got = _figures(_measure(measured, case).step)
    lay = ParallelLayout(pp=4, micro_batches=8, virtual_stages=2)
    assert _figures(interleaved_rank_step(TINY8, S, 1, case[4], lay, 0, "traced")[0]) != got
    lay4 = ParallelLayout(pp=4, micro_batches=4, virtual_stages=2)
    assert _figures(interleaved_rank_step(TINY8, S, 1, case[4], lay4, 1, "traced")[0]) != got
    assert _figures(interleaved_rank_step(TINY8, S, 1, TrainingSetup(checkpoint="full"), lay, 1, "traced")[0]) != got
    # and the 1F1B order on the same chunks would not do: the schedule is torch's interleaved one
    assert interleaved_order(4, 2, 8, 1)[:6] == [(True, 0)] * 4 + [(True, 1)] * 2


@pytest.mark.parametrize("case", GRID, ids=_id)
def test_interleaved_rank_states_baseline_and_ends_are_exact(case, measured):
    """Exact on the measured rank: its parameters, gradients and AdamW moments (each chunk's, summed),
    its baseline (every chunk's parameters, moments and RoPE tables, the step's ids on the rank with stage
    0, its targets on the rank with the last), the backward's end (+ every chunk's receive buffers and
    gradients) and the optimizer step's (the buffers stay); its sends and receives (rule 11)."""
    torch = pytest.importorskip("torch")
    assert torch.__version__.startswith("2.13")
    P, m, rank, B, setup = case
    lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=2)
    got = _measure(measured, case)
    step, st, _ = interleaved_rank_estimate(_cfg(P), S, B, setup, lay, rank)
    assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert got.step.baseline == step.baseline
    assert got.step.backward.end == step.backward.end
    assert got.step.optimizer_step.end == step.optimizer_step.end
    assert got.collectives == totals(step_collectives(_cfg(P), S, B, setup, lay, rank=0, stage=rank))
    assert stage_replayed(_cfg(P), setup, dataclasses.replace(lay, dp=2, zero=3))  # beside FSDP2: replayed


def test_interleaved_transfers_by_hand(measured):
    """pp 2, v 2, m 4, fp32: rank 0 holds chunks 0 (one neighbour) and 2 (two): 3m = 12 transfers each
    way, (1, 16, 24) fp32 hidden states or their gradients."""
    got = _measure(measured, (2, 4, 0, 1, TrainingSetup(checkpoint="none")))
    n = 2 * 3 * 4
    assert got.collectives == {"send_recv": (n, n * S * TINY4.d_model * 4)}


def test_estimate_error_is_reported(measured, capsys):
    """Not an assertion of closeness: the estimate's peaks against the measured rank's, printed (run with
    -s) so the report can quote them."""
    rows = []
    for case in GRID:
        P, m, rank, B, setup = case
        lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=2)
        got = _measure(measured, case).step
        est = interleaved_rank_estimate(_cfg(P), S, B, setup, lay, rank)[0]
        peaks = lambda x: (x.forward.peak, x.backward.peak)
        rows.append((_id(case), *(e / g - 1 for e, g in zip(peaks(est), peaks(got), strict=True))))
    with capsys.disabled():
        for name, fwd, bwd in rows:
            print(f"{name}: estimate's forward peak {100 * fwd:+.1f} %, backward peak {100 * bwd:+.1f} %")
    assert len(rows) == len(GRID)


BESIDE = [
    ParallelLayout(pp=2, micro_batches=4, virtual_stages=2, **kw)
    for kw in (
        {"dp": 2, "zero": 0},
        {"dp": 2, "zero": 1},
        {"dp": 4, "zero": 1},
        {"tp": 2},
        {"tp": 2, "sequence_parallel": True},
        {"tp": 2, "vocab_parallel": True},
        {"tp": 2, "sequence_parallel": True, "vocab_parallel": True},
    )
]


@pytest.mark.parametrize("setup", [TrainingSetup(), TrainingSetup(precision="amp-bf16", checkpoint="full")])
@pytest.mark.parametrize("lay", BESIDE, ids=lambda lay: lay.label)
def test_interleaved_rank_step_is_exact_beside_ddp_zero1_and_tp(lay, setup):
    """Beside DDP (each chunk its own DDP module and buckets), ZeRO-1 (a ``ZeroRedundancyOptimizer`` per
    chunk; the measured data-parallel rank ``interleaved_dp_rank``'s) and TP (the TP-local chunks, with SP
    and vocab parallel): every phase, the model states, the collectives and sends, the matmul FLOPs, at B 2."""
    from lm_accounting.analytic.parallel import rank_flops
    from lm_accounting.measure.pipeline import measure_interleaved_rank

    assert stage_replayed(TINY4, setup, lay)
    for rank in range(2):
        got = measure_interleaved_rank(TINY4, S, 2, setup, lay, rank)
        step, st, _ = interleaved_rank_step(TINY4, S, 2, setup, lay, rank, "traced")
        assert _figures(step) == _figures(got.step), rank
        assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
        assert got.collectives == totals(step_collectives(TINY4, S, 2, setup, lay, rank=st.rank, stage=rank))
        assert got.local_flops == rank_flops(TINY4, S, 2, setup, lay, st.rank, rank).hardware


FSDP = [
    (ParallelLayout(pp=2, micro_batches=4, virtual_stages=2, dp=2, zero=z), TrainingSetup(precision=p), 1)
    for z in (2, 3)
    for p in ("fp32", "amp-bf16")
] + [
    (ParallelLayout(pp=2, micro_batches=8, virtual_stages=2, dp=4, zero=3), TrainingSetup(checkpoint="full", precision="amp-bf16"), 1),
    (ParallelLayout(pp=2, micro_batches=4, virtual_stages=2, dp=2, zero=2), TrainingSetup(attention="sdpa", checkpoint="selective", precision="bf16"), 2),
    (ParallelLayout(pp=2, micro_batches=4, virtual_stages=2, dp=2, zero=3, tp=2, sequence_parallel=True),
     TrainingSetup(precision="amp-bf16"), 2),
    (ParallelLayout(pp=2, micro_batches=4, virtual_stages=2, dp=2, zero=2, tp=2, vocab_parallel=True), TrainingSetup(), 1),
]  # fmt: skip


def _check_fsdp2_rank(cfg, lay, setup, B, rank):
    """The measured rank against the replay: every phase's peak and end and the baseline, the model states and
    the collectives (FSDP2's gathers counted along the runtime's actions, ``interleaved_gathers``)."""
    from lm_accounting.measure.pipeline import measure_interleaved_rank

    got = measure_interleaved_rank(cfg, S, B, setup, lay, rank)
    step, st, _ = interleaved_rank_step(cfg, S, B, setup, lay, rank, "traced")
    assert _figures(step) == _figures(got.step), rank
    assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert got.collectives == totals(step_collectives(cfg, S, B, setup, lay, rank=st.rank, stage=rank))
    return got


@pytest.mark.parametrize("lay, setup, B", FSDP, ids=lambda x: getattr(x, "label", str(x)))
def test_beside_fsdp2_the_replay_equals_the_measured_rank(lay, setup, B, capsys):
    """Beside FSDP2 the runtime unshards every chunk before the rank's first action (``_add_unshard_reshard``:
    up to 3 chunks at once) and reduces each after its last backward (``_add_reduce_grad``): replayed so
    (``_interleaved_schedule``'s ``fsdps``), every phase's peak and end, the baseline, the model states and
    the collectives equal the measured rank's.  The estimate ``interleaved_rank_estimate`` stood beside FSDP2
    before; its error is printed (run with -s)."""
    assert stage_replayed(TINY4, setup, lay)
    for rank in range(2):
        got = _check_fsdp2_rank(TINY4, lay, setup, B, rank)
        est = interleaved_rank_estimate(TINY4, S, B, setup, lay, rank)[0]
        fwd, bwd = (100 * (getattr(est, p).peak / getattr(got.step, p).peak - 1) for p in ("forward", "backward"))
        with capsys.disabled():
            print(f"{lay.label} {setup.label} rank {rank}: estimate's forward peak {fwd:+.1f} %, backward {bwd:+.1f} %")


def _tiny(layers: int) -> ModelConfig:
    return dataclasses.replace(TINY4, num_layers=layers, name=f"tiny{layers}")


DEEP = [  # (layers, pp, v, m, rank): more than 3 chunks a rank, so the runtime reshards and gathers them again
    (L, P, 4, m, rank) for L, P, m, ranks in ((8, 2, 4, (0, 1)), (16, 4, 8, (0, 1, 3))) for rank in ranks
]


@pytest.mark.grid
@pytest.mark.parametrize("layers, P, v, m, rank", DEEP)
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize(
    "setup", [TrainingSetup(precision=p, checkpoint=c) for p in PRECISIONS for c in CHECKPOINTS], ids=lambda s: s.label
)
def test_beside_fsdp2_more_than_three_chunks_grid(layers, P, v, m, rank, zero, setup):
    """v = 4 beside FSDP2 over dp 2: ``_add_unshard_reshard`` keeps 3 chunks unsharded, so before each computation
    it RESHARDs the active chunks not among the next 3 the rank computes and UNSHARDs those not yet active
    (``_runtime_actions``); replayed so, byte for byte, ZeRO-2 and -3 (whose forwards reshard by themselves),
    pp 2 (every rank) and 4 (ranks 0, 1, 3), fp32 and amp-bf16, no and full checkpointing."""
    lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=v, dp=2, zero=zero)
    _check_fsdp2_rank(_tiny(layers), lay, setup, 1, rank)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layers, P, v, m, zero, precision",
    [(10, 2, 5, 4, 3, "amp-bf16"), (13, 2, 6, 6, 2, "amp-bf16"), (16, 2, 8, 4, 3, "fp32"), (9, 4, 2, 4, 2, "fp32")],
)
def test_beside_fsdp2_deep_interleaving_every_rank(layers, P, v, m, zero, precision):
    """v = 5, 6 and 8 (13 blocks over 12 stages: the first one 2) and an uneven pp 4, v 2 split, every rank:
    the replay equals the measured rank."""
    lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=v, dp=2, zero=zero)
    for rank in range(P):
        _check_fsdp2_rank(_tiny(layers), lay, TrainingSetup(precision=precision), 1, rank)


def test_beside_fsdp2_v4_gathers_by_hand():
    """pp 2, v 4, m 4, ZeRO-2, rank 0 (chunks 0, 2, 4, 6 of 8; one block each, chunk 0 also the embedding: 5
    units).  Rounds of r = 2, warm-up 3·2 + 2 = 8 forwards, so its computations (chunk indices) are
    F 0 0 1 1 2 2 3 3, then pairs (F 0, B 3) (F 0, B 3) (F 1, B 2) (F 1, B 2) (F 2, B 1) (F 2, B 1) (F 3, B 0)
    (F 3, B 0), then B 3 3 2 2 1 1 0 0.  Before computation i ``_add_unshard_reshard`` keeps the next 3 distinct
    chunks from i on: UNSHARD 0 1 2 at i = 0; at i = 2 (next 1 2 3) RESHARD 0, UNSHARD 3; i = 4 (2 3 0):
    0 again; i = 6 (3 0 1): 1 again; i = 11 (3 1 2): 2 again; i = 19 (1 3 0): 0 again; i = 20 (3 0 2): 2 again;
    i = 24 (3 2 1): 1 again; i = 26 (2 1 0): 0 again.  The first backward is i = 9: chunk 0 is gathered at
    i = 0 and 4 before it and at 19 and 26 after; chunk 1 at 0, 6 | 24; chunk 2 at 0 | 11, 20; chunk 3 at 2.
    ZeRO-2's forwards and backwards find their chunk unsharded (the window holds it): no other gather.
    All-gathers: 4 passes × 2 units + 3 + 3 + 1 = 15 (1F1B's rule 9, once a step: 5)."""
    from lm_accounting.analytic.pipeline import interleaved_gathers

    lay = ParallelLayout(pp=2, micro_batches=4, virtual_stages=4, dp=2, zero=2)
    assert interleaved_gathers(lay, 0) == ((2, 2), (2, 1), (1, 2), (1, 0))
    got = _check_fsdp2_rank(TINY8, lay, TrainingSetup(), 1, 0)
    assert got.collectives["all_gather"][0] == 15


def test_beside_fsdp2_the_harness_keeps_no_rope_table_of_a_replaced_module():
    """Why the measured baseline was 384 B above the replay's on a rank of middle chunks (pp 4, v 2, rank 1):
    FSDP2's ``fully_shard`` (torch 2.13 ``_fsdp_init._get_managed_modules``) leaves a reference cycle (its
    recursive ``dfs`` closure) holding the root's managed modules, among them the RoPE module that the
    harness's ``_materialise`` then replaces: its two tables (2·S·(d_head/2)·4 = 384 B) lived until Python's
    cycle collector ran, during the step.  The cycle is torch's (shown here on a bare module); the measurement
    collects it before its baseline, and the replay equals it."""
    import gc
    import weakref

    torch = pytest.importorskip("torch")
    from torch.distributed.fsdp import fully_shard

    from lm_accounting.measure.distributed import init_fake_group

    init_fake_group(2, 0)
    gc.disable()
    try:
        root = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Identity())
        fully_shard(root)
        old = weakref.ref(root[1])
        root[1] = torch.nn.Identity()  # as ``_materialise`` replaces ``model.rope``
        assert old() is not None  # held by the cycle alone
        gc.collect()
        assert old() is None
    finally:
        gc.enable()
    lay = ParallelLayout(pp=4, micro_batches=8, virtual_stages=2, dp=2, zero=2)
    _check_fsdp2_rank(TINY8, lay, TrainingSetup(), 1, 1)


def test_measurement_refuses_what_it_does_not_run():
    from lm_accounting.measure.pipeline import measure_interleaved_rank

    lay = ParallelLayout(pp=2, micro_batches=2, virtual_stages=2)
    with pytest.raises(AccountingError, match="takes no DTensor"):
        ddp_tp = ParallelLayout(dp=2, tp=2, pp=2, micro_batches=2, virtual_stages=2)
        measure_interleaved_rank(TINY4, S, 1, TrainingSetup(), ddp_tp)
    assert not stage_replayed(TINY4, TrainingSetup(), ddp_tp)  # estimated
    with pytest.raises(AccountingError, match="outside the 2 ranks"):
        measure_interleaved_rank(TINY4, S, 1, TrainingSetup(), lay, 2)


@pytest.mark.slow
def test_cli_measures_the_predicted_rank(run_cli):
    """``memory --pp 2 --virtual-stages 2 --measure meta``: torch's ScheduleInterleaved1F1B runs the
    worst pipeline rank, its step printed beside the replay's: equal."""
    import json

    args = ["memory", "gpt2-small", "--layers", "4", "--set", "tie_embeddings=false", "--context", "32"]
    r = run_cli(
        *args, "--pp", "2", "--virtual-stages", "2", "--micro-batches", "4", "--measure", "meta", "--format", "json"
    )
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["peaks_exact"] and d["layout"]["virtual_stages"] == 2
    assert d["measured"]["rank"] == d["worst_rank"]["pipeline_stage"]
    assert d["measured"]["step"] == d["step_traced"]
    assert d["measured"]["local_matmul_flops"] == d["flops"]["hardware"]
    # 4 micro-batches; rank 1 holds chunks 1 (two neighbours) and 3 (the last: one): 3·4 transfers each way
    assert d["measured"]["collectives"] == {"send_recv": {"count": 24, "payload_bytes": 24 * 32 * 768 * 4}}


BEYOND = [  # (layers, pp, v, m): uneven splits, pp 3, m not a multiple of pp (one round), v 3 and 4
    (5, 2, 2, 2), (5, 2, 2, 4), (6, 3, 2, 3), (6, 3, 2, 5), (8, 4, 2, 6), (9, 4, 2, 4), (6, 2, 3, 4), (8, 2, 4, 4),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("layers, P, v, m", BEYOND)
@pytest.mark.parametrize(
    "setup", [TrainingSetup(), TrainingSetup(precision="amp-bf16", checkpoint="selective", attention="sdpa")]
)
def test_interleaved_rank_step_is_exact_beyond_the_grid(layers, P, v, m, setup):
    """Every rank, every phase, byte for byte: the split over pp·v stages the first L mod pp·v one block more
    (5 blocks over 4 stages: 2, 1, 1, 1), torch's rounds of m // pp micro-batches where m is not a multiple
    of pp (pp 4, m 6: one round of 6), three and four chunks a rank."""
    from lm_accounting.measure.pipeline import measure_interleaved_rank

    cfg = dataclasses.replace(TINY4, num_layers=layers, name=f"tiny{layers}")
    lay = ParallelLayout(pp=P, micro_batches=m, virtual_stages=v)
    for rank in range(P):
        got = measure_interleaved_rank(cfg, S, 1, setup, lay, rank).step
        assert _figures(interleaved_rank_step(cfg, S, 1, setup, lay, rank, "traced")[0]) == _figures(got), rank


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["foreach", "fused", "for-loop"])
@pytest.mark.parametrize("tied", [False, True])
def test_interleaved_rank_step_is_exact_per_optimizer_and_tied_head(optimizer, tied):
    """One AdamW per chunk (fused: each chunk's step counters on the device), B 2, and a tied head (a second
    copy of the embedding on the last stage, as 1F1B's)."""
    from lm_accounting.measure.pipeline import measure_interleaved_rank

    cfg = dataclasses.replace(TINY4, tie_embeddings=tied)
    setup, lay = TrainingSetup(optimizer=optimizer), ParallelLayout(pp=2, micro_batches=4, virtual_stages=2)
    for rank in range(2):
        got = measure_interleaved_rank(cfg, S, 2, setup, lay, rank).step
        assert _figures(interleaved_rank_step(cfg, S, 2, setup, lay, rank, "traced")[0]) == _figures(got), rank
