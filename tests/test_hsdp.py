"""HSDP: FSDP2 over a (dp_replicate, dp_shard) mesh (``layout.ParallelLayout.replicate``, torchtitan's
``ParallelDims.dp_replicate`` × ``dp_shard``).  Each rank's model states, every phase's peak and end, and every
collective (count, bytes, phase and the process group it ran over) against one rank of the real job
(``fully_shard`` over a 2-D mesh, torch 2.13) on the fake process group; the refusals; the planner's HSDP
candidates and their pricing."""

import itertools

import pytest

from lm_accounting.analytic.collectives import Collective, step_collectives, wire_bytes
from lm_accounting.analytic.parallel import model_states, rank_step
from lm_accounting.config import AccountingError, ModelConfig
from lm_accounting.gpus import gpu
from lm_accounting.layout import ParallelLayout
from lm_accounting.plan import DEFAULT_INTERNODE, GPUS_PER_NODE, _families, price_layout
from lm_accounting.setup import TrainingSetup

# vocab 101: the root's embedding and LM head shard unevenly over 4 ranks (26, 26, 26, 23 rows) and over
# 8 (13 rows each, the last 10): the shard group's last rank holds fewer AdamW rows than its first
TINY = ModelConfig(
    vocab_size=101, context_length=16, num_layers=2, d_model=24, num_heads=4, num_kv_heads=2, d_ff=40, name="tiny"
)
S = 16
MESHES = [(2, 4), (4, 8), (8, 8)]  # (replicate, shard): worlds of 8, 32 and 64
SETUPS = [
    TrainingSetup(attention=a, checkpoint=c, precision=p)
    for a, c, p in itertools.product(("naive", "sdpa"), ("none", "full"), ("fp32", "bf16", "amp-bf16"))
]


# -- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dp": 8, "zero": 3, "replicate": 3}, "replicate=3 does not divide dp=8"),
        ({"dp": 8, "zero": 1, "replicate": 2}, "use --zero 2 or 3"),
        ({"dp": 8, "zero": 0, "replicate": 2}, "use --zero 2 or 3"),
        ({"dp": 8, "zero": 3, "replicate": 8}, "shard groups of one rank"),
        ({"dp": 8, "zero": 3, "replicate": 2, "pp": 2, "micro_batches": 2, "ep": 2}, "both pipeline and expert"),
        ({"dp": 8, "zero": 3, "replicate": 0}, "replicate must be a positive integer"),
    ],
)
def test_layouts_that_do_not_factor_are_refused(fields, message):
    with pytest.raises(AccountingError, match=message):
        ParallelLayout(**fields)


def test_the_cli_refuses_in_one_line(run_cli):
    r = run_cli("memory", "llama-3-8b", "--dp", "8", "--zero", "3", "--replicate", "3")
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1 and "does not divide" in r.err


def test_other_implementations_refuse_hsdp_in_one_line(run_cli):
    """The op library replays FSDP2 over transformers' programs over one shard group only: HSDP is refused."""
    r = run_cli("memory", "llama-3-8b", "--dp", "8", "--zero", "3", "--replicate", "2", "--impl", "transformers")
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1 and "HSDP" in r.err


def test_the_label_and_the_json_name_both_degrees(run_cli):
    lay = ParallelLayout(dp=8, zero=3, replicate=2)
    assert lay.label == "dp8·zero3·hsdp2x4" and lay.shard == 4 and lay.world == 8
    assert lay.to_dict()["replicate"] == 2 and lay.to_dict()["shard"] == 4
    r = run_cli("memory", "llama-3-8b", "--dp", "8", "--zero", "3", "--replicate", "2", "--format", "json")
    assert r.code == 0 and '"dp_replicate"' in r.out and '"dp_shard"' in r.out


# -- model states and collectives by hand ---------------------------------------------------------------------


def test_states_and_collectives_written_out_by_hand():
    """(replicate, shard) = (2, 4), fp32, zero 3.  A block is 4,656 elements (ln1 24, q 24·24, k and v 12·24,
    o 24·24, ln2 24, w1/w2/w3 3·40·24), every dim 0 divisible by 4: a shard of 1,164 elements, 4,656 B.  The
    root: embedding and LM head ceil(101/4) = 26 rows of 24 each, ln_final 24/4 = 6: 1,254 elements, 5,016 B.
    Parameters 2·4,656 + 5,016 = 14,328 B: the model over the shard group's four ranks, not over all eight."""
    lay = ParallelLayout(dp=8, zero=3, replicate=2)
    st = model_states(TINY, TrainingSetup(), lay)
    assert st.parameters == st.gradients == 2 * 4_656 + 5_016 == 14_328
    assert st.optimizer == 2 * 14_328  # rank 0: every chunk full
    assert model_states(TINY, TrainingSetup(), ParallelLayout(dp=8, zero=3)).parameters != 14_328
    # shard rank 3 (data-parallel ranks 3 and 7): the embedding and head keep 101 − 3·26 = 23 real rows each
    assert model_states(TINY, TrainingSetup(), lay, rank=7).optimizer == 2 * (14_328 - 2 * 3 * 24 * 4)
    # collectives: units gathered padded over the shard group, G = 4·14,328 = 57,312 B, twice (zero 3);
    # reduce-scattered once; each unit's shard (4,656 + 4,656 + 5,016 = 14,328 B) all-reduced over the replicas
    want = [
        Collective("all_gather", "forward", "dp_shard", 3, 57_312, "every unit, padded (G)"),
        Collective("all_gather", "backward", "dp_shard", 3, 57_312, "every unit again (G)"),
        Collective("reduce_scatter", "backward", "dp_shard", 3, 57_312, "every unit's gradients (R)"),
        Collective("all_reduce", "backward", "dp_replicate", 3, 14_328, "every unit's reduce-scatter output (R/s)"),
    ]
    got = step_collectives(TINY, S, 1, TrainingSetup(), lay)
    assert [c[:5] for c in got] == [c[:5] for c in want]
    # wire bytes: ring all-gather/reduce-scatter (s − 1)/s over the shard group, all-reduce 2(r − 1)/r
    assert wire_bytes(got[0], 4) == 57_312 * 3 // 4 and wire_bytes(got[3], 2) == 14_328


# -- the fake process group -----------------------------------------------------------------------------------


def _group_of(c_group: str, lay: ParallelLayout, rank: int) -> tuple[int, ...]:
    """The global ranks of ``rank``'s group on the (dp_replicate, dp_shard, tp) mesh, written out: the shard
    group is shard·tp consecutive ranks, stride tp; the replicate group strides shard·tp."""
    s, t = lay.shard, lay.tp
    replica, inner = divmod(rank, s * t)
    if c_group == "dp_shard":
        return tuple(replica * s * t + j * t + inner % t for j in range(s))
    if c_group == "dp_replicate":
        return tuple(i * s * t + inner for i in range(lay.replicate))
    assert c_group == "tp"
    return tuple(rank - rank % t + j for j in range(t))


def _check_collectives(m, lay: ParallelLayout, setup: TrainingSetup, rank: int) -> None:
    """Every recorded collective in the predicted (kind, phase, group) bucket, with the predicted counts and
    bytes, and each one's process group the one the layout names."""
    want = step_collectives(TINY, S, 1, setup, lay, first_step=True, rank=rank // lay.tp)
    groups = {_group_of(c.group, lay, rank): c.group for c in want}
    assert len(groups) == len({c.group for c in want})  # the groups are told apart by their ranks
    got: dict = {}
    for (kind, nbytes, phase), ranks in zip(m.calls, m.groups, strict=True):
        n, b = got.get((kind, phase, groups[ranks]), (0, 0))
        got[(kind, phase, groups[ranks])] = (n + 1, b + nbytes)
    expected: dict = {}
    for c in want:
        n, b = expected.get((c.kind, c.phase, c.group), (0, 0))
        expected[(c.kind, c.phase, c.group)] = (n + c.count, b + c.payload)
    assert got == expected


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"{m[0]}x{m[1]}")
def test_hsdp_rank_is_byte_exact(mesh, zero, setup):
    """Rank 0 and the last rank (the shard group's last: uneven rows) of the HSDP job: states, every phase
    and every collective."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    r, s = mesh
    lay = ParallelLayout(dp=r * s, zero=zero, replicate=r)
    for rank in (0, lay.world - 1):
        m = measure_rank(TINY, S, 1, setup, lay, rank=rank)
        step, st, _ = rank_step(TINY, S, 1, setup, lay, mode="traced", rank=rank)
        assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer)
        assert m.step == step
        _check_collectives(m, lay, setup, rank)


def test_hsdp_rank_at_64_ranks():
    """The default run's case of the grid above: (8, 8), amp-bf16, zero 3, rank 63 (shard rank 7: 10 of 13
    rows of the embedding and head)."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    lay, setup = ParallelLayout(dp=64, zero=3, replicate=8), TrainingSetup(precision="amp-bf16")
    m = measure_rank(TINY, S, 1, setup, lay, rank=63)
    step, st, _ = rank_step(TINY, S, 1, setup, lay, mode="traced", rank=63)
    assert (m.params, m.optimizer, m.step) == (st.parameters, st.optimizer, step)
    assert m.optimizer < model_states(TINY, setup, lay, rank=0).optimizer  # uneven: the last shard is short
    _check_collectives(m, lay, setup, 63)


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS[::2], ids=lambda s: s.label)
@pytest.mark.parametrize("extra", [{"sequence_parallel": True}, {"vocab_parallel": True}, {}], ids=["sp", "vp", "tp"])
def test_hsdp_times_tensor_parallel_is_byte_exact(extra, setup):
    """HSDP (2, 2) × TP 2 on 8 ranks, TP rank 0 of the last replica's last shard rank (global rank 6): the TP
    collectives over the tp group, FSDP2's over the shard group (stride tp), the all-reduces over the
    replicas."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    lay = ParallelLayout(dp=4, zero=3, replicate=2, tp=2, **extra)
    m = measure_rank(TINY, S, 1, setup, lay, rank=6)
    assert m.step == rank_step(TINY, S, 1, setup, lay, mode="traced", rank=3)[0]
    _check_collectives(m, lay, setup, 6)


# -- beside pipeline parallel ---------------------------------------------------------------------------------

# (pp, m, dp, replicate, extra): torchtitan's (pp, dp_replicate, dp_shard, tp) mesh; 1F1B, deep, wide, TP + SP and
# interleaved 1F1B beside FSDP2
PIPELINES = [
    (2, 2, 4, 2, {}),
    (4, 8, 4, 2, {}),
    (2, 4, 8, 2, {}),
    (2, 4, 8, 4, {}),
    (2, 4, 4, 2, {"tp": 2, "sequence_parallel": True}),
    (2, 4, 4, 2, {"virtual_stages": 2}),
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS[::3], ids=lambda s: s.label)
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("case", PIPELINES, ids=lambda c: f"pp{c[0]}x{c[1]}-hsdp{c[3]}x{c[2] // c[3]}-{c[4]}")
def test_hsdp_beside_pipeline_parallel_is_byte_exact(case, zero, setup):
    """The first and last stage (pipeline rank) of the job, on the last data-parallel rank (the last replica's
    last shard rank: uneven rows): every phase's peak and end, the stage's states, and its collectives (FSDP2's
    over the shard group as rule 9 or 11 counts them, each unit's shard all-reduced over the replicas, the
    point-to-point transfers).  The stage is its shard group's FSDP2 stage (rule 8)."""
    pytest.importorskip("torch")
    from test_pipeline_measured import TINY4, _figures

    from lm_accounting.analytic.collectives import totals
    from lm_accounting.analytic.pipeline import stage_step
    from lm_accounting.measure.pipeline import measure_stage_rank

    pp, m, dp, r, extra = case
    lay = ParallelLayout(pp=pp, micro_batches=m, dp=dp, zero=zero, replicate=r, **extra)
    for stage in (0, pp - 1):
        got = measure_stage_rank(TINY4, S, 1, setup, lay, stage, dp_rank=dp - 1)
        step, st, _ = stage_step(TINY4, S, 1, setup, lay, stage, mode="traced", rank=dp - 1)
        assert _figures(got.step) == _figures(step)
        assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
        assert got.collectives == totals(step_collectives(TINY4, S, 1, setup, lay, stage=stage))


def test_hsdp_beside_pipeline_parallel_collectives_by_hand():
    """pp 2 × HSDP (2, 2), ZeRO-3, m = 2, fp32, stage 0 of TINY4 (4 blocks: 2 a stage, the embedding its root
    unit): 3 units; ZeRO-3 gathers each m + 1 = 3 times over the shard group (rule 9), reduce-scatters each once,
    then all-reduces each unit's shard (R/s, s = 2) over the 2 replicas (rule 12); the payloads are the stage's
    padded units, counted below (the measured job's 47,040 B, tests/test_hsdp.py's grid)."""
    from test_pipeline_measured import TINY4

    lay = ParallelLayout(pp=2, micro_batches=2, dp=4, zero=3, replicate=2)
    got = step_collectives(TINY4, S, 1, TrainingSetup(), lay)
    # stage 0's units, dim 0 padded to a multiple of s = 2: the embedding (101 -> 102 rows of 24), and 2 blocks of
    # two norms (24 each), q and o (24 x 24 each), k and v (12 x 24 each: 2 KV heads of 6), w1, w3, w2 (40 x 24 each)
    block = 2 * 24 + 2 * 24 * 24 + 2 * 12 * 24 + 3 * 40 * 24
    gradients = (102 * 24 + 2 * block) * 4  # fp32
    assert sum(c.count for c in got if (c.kind, c.group) == ("all_gather", "dp_shard")) == 3 * 3
    (rs,) = [c for c in got if c.kind == "reduce_scatter"]
    assert (rs.group, rs.count, rs.payload) == ("dp_shard", 3, gradients)
    (ar,) = [c for c in got if c.kind == "all_reduce"]
    assert (ar.group, ar.phase, ar.count, ar.payload) == ("dp_replicate", "backward", 3, gradients // 2)


# -- the planner ----------------------------------------------------------------------------------------------


def test_plan_enumerates_hsdp_with_the_shard_group_in_one_node():
    cfg = TINY.with_context(16)
    fams = [f for f in _families(cfg, 16, (64, 64), 64) if f["replicate"] > 1]
    shards = {(f["dp"] // f["replicate"], f["tp"]) for f in fams}
    # shard·tp <= 8, shard >= 2; TINY's 2 kv heads allow tp 1 and 2 only
    assert shards == {(2, 1), (4, 1), (8, 1), (2, 2), (4, 2)}
    assert all(f["zero"] in (2, 3) and f["pp"] == 1 and f["ep"] == 1 for f in fams)
    for f in fams:  # each a valid layout
        ParallelLayout(**f, micro_batches=1).check(cfg, 16)


PRICED = ModelConfig(
    vocab_size=101, context_length=32, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48, name="priced"
)  # head_dim 8: the step-time model prices fused attention at it


def test_plan_prices_the_shard_group_on_nvlink_and_the_replicas_between_nodes():
    """64 GPUs, (replicate, shard) = (8, 8), amp-bf16, zero 3, one micro-batch.  The shard group's wire bytes
    over NVLink: all-gathers in bf16 of the shard group's padded units, twice, and the reduce-scatter in fp32,
    each (s − 1)/s; the replicas' all-reduce of the fp32 sharded gradients (the parameters' padded shard,
    fp32: ``model_states``' parameters, measured above), 2(r − 1)/r, over the 50 GB/s inter-node link."""
    setup = TrainingSetup(attention="sdpa", precision="amp-bf16")
    lay = ParallelLayout(dp=64, zero=3, replicate=8)
    shard = model_states(PRICED, setup, lay).parameters  # bytes of a shard in fp32 = the reduce-scatter output
    gathered, reduced = shard * 8 // 2, shard * 8  # bf16 all-gather, fp32 reduce-scatter, over 8 ranks
    nvlink = gpu("h100-80gb").interconnect_one_way
    within = 2 * (gathered * 7 // 8) + reduced * 7 // 8
    across = 2 * shard * 7 // 8
    times = price_layout(PRICED, "h100-80gb", 32, 1, setup, lay)
    assert times[1] == pytest.approx(within / nvlink + across / DEFAULT_INTERNODE, rel=1e-12)
    # the same 64 ranks as one FSDP2 group span 8 nodes: every byte over the inter-node link
    flat = price_layout(PRICED, "h100-80gb", 32, 1, setup, ParallelLayout(dp=64, zero=3))
    assert 8 * GPUS_PER_NODE == 64 and flat[1] > times[1]
    # compute: each GPU steps AdamW over its shard group's eighth of the states, as FSDP2 over 8 ranks does
    assert times[0] == price_layout(PRICED, "h100-80gb", 32, 1, setup, ParallelLayout(dp=8, zero=3))[0] > flat[0]
