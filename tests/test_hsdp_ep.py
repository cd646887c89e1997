"""HSDP beside expert parallel, torchtitan's MoE mesh (``ParallelDims._build_mesh_with_ep``: dp_replicate ×
dp_shard_mod_ep × dp_shard_in_ep, ep borrowed from dp_shard; ``apply_fsdp`` in
``torchtitan/models/{llama4,deepseek_v3}/infra/parallelize.py``): the dense units FSDP2 over (dp_replicate,
dp_shard), the expert stacks over (dp_replicate, dp_shard_mod_ep).  Each rank's model states, every phase's peak
and end, and every collective (count, bytes, phase and the ranks of the process group it ran over) against one
rank of the real job (torch 2.13's ``fully_shard`` over both 2-D meshes) on the fake process group; the
refusals; the planner's candidates and their pricing."""

from collections import Counter

import pytest

from lm_accounting.analytic.collectives import Collective, step_collectives, wire_bytes
from lm_accounting.analytic.parallel import model_states, rank_flops, rank_step
from lm_accounting.config import AccountingError, ModelConfig
from lm_accounting.layout import ParallelLayout
from lm_accounting.parallelisms import group_ranks
from lm_accounting.setup import TrainingSetup

TINY = dict(vocab_size=101, context_length=16, d_model=24, num_heads=4, d_ff=40)
MIXTRAL = ModelConfig(**TINY, num_layers=2, num_kv_heads=2, num_experts=4, experts_per_token=2, name="tiny-mixtral")
QWEN3_MOE = ModelConfig(
    **TINY, num_layers=3, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=6, experts_per_token=2,
    expert_d_ff=12, moe_every=2, tie_embeddings=True, name="tiny-qwen3-moe",
)  # fmt: skip
# DeepSeek's MoE (shared experts, a dense first block) with attention without MLA (tests/test_parallel_moe.py)
DEEPSEEK_MHA = ModelConfig(
    **TINY, num_layers=3, num_kv_heads=2, num_experts=4, experts_per_token=3, expert_d_ff=8, shared_experts=2,
    dense_layers_first=1, name="tiny-deepseek-mha",
)  # fmt: skip
S = 16


def _lay(r: int, s: int, ep: int, zero: int = 3) -> ParallelLayout:
    return ParallelLayout(dp=r * s, zero=zero, replicate=r, ep=ep)


# -- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dp": 8, "zero": 3, "replicate": 2, "ep": 8}, "ep=8 does not divide HSDP's shard degree 4"),
        ({"dp": 12, "zero": 3, "replicate": 3, "ep": 3}, "ep=3 does not divide HSDP's shard degree 4"),
        (
            {"dp": 8, "zero": 3, "replicate": 2, "ep": 2, "pp": 2, "micro_batches": 2},
            "beside both pipeline and expert parallel",
        ),
        ({"dp": 8, "zero": 1, "replicate": 2, "ep": 2}, "use --zero 2 or 3"),
    ],
)
def test_layouts_that_do_not_factor_are_refused(fields, message):
    with pytest.raises(AccountingError, match=message):
        ParallelLayout(**fields)


def test_the_cli_refuses_in_one_line(run_cli):
    r = run_cli("memory", "qwen3-30b-a3b", "--dp", "8", "--zero", "3", "--replicate", "2", "--ep", "8")
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1 and "shard degree 4" in r.err


def test_hsdp_beside_pipeline_and_expert_parallel_says_why_in_one_line(run_cli):
    """The refusal names its cause: no mixture of experts is accounted under pipeline parallel (HSDP or not)."""
    args = ["--dp", "8", "--zero", "3", "--replicate", "2", "--ep", "2", "--pp", "2"]
    r = run_cli("memory", "qwen3-30b-a3b", *args)
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1, r.err
    assert "no mixture of experts is accounted under pipeline parallel" in r.err
    r = run_cli("memory", "qwen3-30b-a3b", "--dp", "8", "--zero", "3", "--ep", "2", "--pp", "2")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "pipeline parallel are not" in r.err, r.err


def test_the_cli_accounts_the_mesh(run_cli):
    r = run_cli("memory", "qwen3-30b-a3b", "--dp", "16", "--zero", "3", "--replicate", "2", "--ep", "4")
    assert r.code == 0 and "hsdp2x8·ep4" in r.out, r.err


def test_each_group_on_the_mesh_written_out():
    """dp 16 = (replicate 2, shard 8), ep 4, tp 2: the all-to-alls over 4 consecutive dp ranks (2 apart), the expert
    units over the 8/4 = 2 shard ranks holding the same experts (4·2 = 8 apart), the dense units over the 8 shard
    ranks (2 apart), the replicas 8·2 = 16 apart."""
    lay = ParallelLayout(dp=16, zero=3, replicate=2, ep=4, tp=2)
    assert group_ranks(lay, "ep") == (4, 2) and group_ranks(lay, "dp_shard/ep") == (2, 8)
    assert group_ranks(lay, "dp_shard") == (8, 2) and group_ranks(lay, "dp_replicate") == (2, 16)


# -- model states and collectives by hand ---------------------------------------------------------------------


def test_states_and_collectives_written_out_by_hand():
    """Tiny Mixtral (E 4, k 2, 2 MoE blocks), (replicate, shard) = (2, 4), ep 2, fp32, zero 3.  Over the shard
    group of 4: the root (embedding and LM head ceil(101/4) = 26 rows of 24, ln_final 24/4 = 6) 1,254 elements;
    a block without its experts (ln1, ln2 6 each, q, o 6·24, k, v 3·24, router 1·24) 468.  The experts: 2 local
    experts per stack, sharded over the s/ep = 2 shard ranks holding them on dim 1, for torchtitan's test
    ``dp_mod_ep_mesh.size() * ep > E`` counts the replicas (2·2·2 = 8 > 4): w1, w3 (2, 20, 24), w2 (2, 12, 40),
    2,880 elements a block.  Parameters (1,254 + 2·(468 + 2,880))·4 = 31,800 B."""
    lay, fp32 = _lay(2, 4, 2), TrainingSetup()
    st = model_states(MIXTRAL, fp32, lay)
    assert st.parameters == st.gradients == (1_254 + 2 * (468 + 2_880)) * 4 == 31_800
    assert st.optimizer == 2 * 31_800
    # shard rank 3 (dp rank 7): the embedding and the head keep 101 − 3·26 = 23 of their 26 rows
    assert model_states(MIXTRAL, fp32, lay, rank=7).optimizer == 2 * (31_800 - 2 * 3 * 24 * 4)
    dense, experts = (1_254 + 2 * 468) * 4, 2 * 2_880 * 4  # a rank's shards, bytes
    alltoall = 2 * 2 * (S * 2 * 24 * 4)  # dispatch and combine per MoE block, T·k·d·4 each
    want = [
        Collective("all_gather", "forward", "dp_shard", 3, 4 * dense, ""),
        Collective("all_gather", "backward", "dp_shard", 3, 4 * dense, ""),
        Collective("reduce_scatter", "backward", "dp_shard", 3, 4 * dense, ""),
        Collective("all_reduce", "backward", "dp_replicate", 3, dense, ""),
        Collective("all_gather", "forward", "dp_shard/ep", 2, 2 * experts, ""),
        Collective("all_gather", "backward", "dp_shard/ep", 2, 2 * experts, ""),
        Collective("reduce_scatter", "backward", "dp_shard/ep", 2, 2 * experts, ""),
        Collective("all_reduce", "backward", "dp_replicate", 2, experts, ""),
        Collective("all_to_all", "forward", "ep", 4, alltoall, ""),
        Collective("all_to_all", "backward", "ep", 4, alltoall, ""),
    ]
    got = step_collectives(MIXTRAL, S, 1, fp32, lay)
    assert [c[:5] for c in got] == [c[:5] for c in want]
    # the expert units' all-reduce crosses the replicas: 2·(2 − 1)/2 of its payload on the wire
    assert wire_bytes(got[7], group_ranks(lay, "dp_replicate")[0]) == experts
    # s = ep: the experts' shard dimension has one rank, FSDP2 gathers and reduce-scatters none of them, and
    # all-reduces each block's whole local stacks (w1, w3 (2, 40, 24), w2 (2, 24, 40)) over the replicas
    alone = step_collectives(MIXTRAL, S, 1, fp32, _lay(2, 2, 2))
    assert {c.group for c in alone} == {"dp_shard", "dp_replicate", "ep"}
    assert [c[:5] for c in alone if c.group == "dp_replicate"][1] == (
        "all_reduce", "backward", "dp_replicate", 2, 2 * 3 * 2 * 40 * 24 * 4
    )  # fmt: skip


def test_the_expert_stacks_follow_the_whole_mesh_not_the_shard_group():
    """The shard group alone (FSDP2 × EP over 4 ranks, 4 = E) would shard the stacks on dim 0; the HSDP job
    (8 ranks > E) shards them on dim 1, whose copy-out goes through one temporary per stack: the peaks differ."""
    lay = _lay(2, 4, 2)
    hsdp, alone = (
        rank_step(MIXTRAL, S, 1, TrainingSetup(), x, mode="traced", rank=0)[0] for x in (lay, lay.shard_group())
    )
    assert hsdp.baseline == alone.baseline and hsdp.backward.peak != alone.backward.peak


# -- the fake process group -----------------------------------------------------------------------------------


def _ranks(group: str, lay: ParallelLayout, rank: int) -> tuple[int, ...]:
    """The global ranks of ``rank``'s group on (dp_replicate, dp_shard_mod_ep, dp_shard_in_ep), tp 1, written
    out: rank = i·s + j·ep + k."""
    s, ep = lay.shard, lay.ep
    i, j, k = rank // s, rank % s // ep, rank % ep
    return {
        "dp_shard": tuple(i * s + x for x in range(s)),
        "dp_replicate": tuple(x * s + rank % s for x in range(lay.replicate)),
        "ep": tuple(i * s + j * ep + x for x in range(ep)),
        "dp_shard/ep": tuple(i * s + x * ep + k for x in range(s // ep)),
    }[group]


def _check(cfg, seq, batch, setup, lay, rank) -> None:
    from lm_accounting.measure.distributed import measure_rank

    m = measure_rank(cfg, seq, batch, setup, lay, rank=rank)
    step, st, _ = rank_step(cfg, seq, batch, setup, lay, mode="traced", rank=rank)
    assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert m.step == step
    assert m.local_flops == rank_flops(cfg, seq, batch, setup, lay, rank).hardware
    want = step_collectives(cfg, seq, batch, setup, lay, first_step=True, rank=rank)
    for c in want:  # each group's ranks are what its parallelism declares to the planner: (ranks, stride)
        ranks = _ranks(c.group, lay, rank)
        n, stride = group_ranks(lay, c.group)
        assert ranks == tuple(ranks[0] + x * stride for x in range(n)), c.group
    expected: Counter = Counter()
    for c in want:  # keyed by the group's ranks: with s = ep the ep group is the shard group
        expected[(c.kind, c.phase, _ranks(c.group, lay, rank))] += c.count
        expected[(c.kind, c.phase, _ranks(c.group, lay, rank), "bytes")] += c.payload
    got: Counter = Counter()
    for (kind, nbytes, phase), ranks in zip(m.calls, m.groups, strict=True):
        got[(kind, phase, ranks)] += 1
        got[(kind, phase, ranks, "bytes")] += nbytes
    assert got == expected


def _setup(attention, checkpoint, precision):
    return TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)


CASES = [
    # (r, s, ep): s = ep (the experts' shard dimension of one rank), s > ep, 4 to 64 ranks
    (MIXTRAL, S, 1, _lay(2, 2, 2), _setup("naive", "none", "fp32")),
    (MIXTRAL, S, 1, _lay(2, 4, 2), _setup("naive", "none", "fp32")),  # 8 > E: dim-1 stacks over 2 ranks
    (MIXTRAL, S, 2, _lay(2, 4, 2, zero=2), _setup("sdpa", "selective", "bf16")),
    (MIXTRAL, 15, 1, _lay(4, 4, 4), _setup("naive", "full", "bf16")),  # 30 slots over 4 experts: uneven rows
    (MIXTRAL, S, 1, _lay(2, 8, 4), _setup("sdpa", "full", "amp-bf16")),
    (MIXTRAL, S, 1, _lay(4, 8, 2), _setup("naive", "none", "amp-bf16")),  # 32 ranks
    (MIXTRAL, S, 1, _lay(8, 8, 4), _setup("sdpa", "full", "amp-bf16")),  # 64 ranks
    (QWEN3_MOE, S, 1, _lay(2, 2, 2), _setup("sdpa", "full", "fp32")),  # 6 experts, tied embeddings
    (QWEN3_MOE, S, 2, _lay(2, 4, 2, zero=2), _setup("naive", "selective", "amp-bf16")),
    (DEEPSEEK_MHA, S, 1, _lay(2, 4, 2), _setup("naive", "selective", "fp32")),  # shared experts, a dense block
    (DEEPSEEK_MHA, S, 1, _lay(2, 4, 4, zero=2), _setup("sdpa", "none", "amp-bf16")),
]


@pytest.mark.grid
@pytest.mark.parametrize(
    ("cfg", "seq", "batch", "lay", "setup"),
    CASES,
    ids=lambda x: getattr(x, "label", getattr(x, "name", None)) if not isinstance(x, int) else f"{x}",
)
def test_hsdp_times_expert_parallel_rank_is_byte_exact(cfg, seq, batch, lay, setup):
    """Rank 0 and the last rank (another replica, the shard group's last: uneven rows; another ep rank): model
    states, every phase's peak and end, the local matmul FLOPs and every collective, with its group's ranks."""
    pytest.importorskip("torch")
    for rank in (0, lay.world - 1):
        _check(cfg, seq, batch, setup, lay, rank)


def test_a_middle_rank_of_the_64_rank_job():
    """(8, 8, 4), zero 3, fp32: dp rank 45 = replica 5, shard rank 5 (dp_shard_mod_ep 1, ep rank 1)."""
    pytest.importorskip("torch")
    _check(MIXTRAL, S, 1, TrainingSetup(), _lay(8, 8, 4), 45)


# -- the planner ----------------------------------------------------------------------------------------------


def test_plan_enumerates_hsdp_beside_expert_parallel():
    """64 GPUs, tiny Mixtral (E 4): every shard group inside one node (2, 4, 8) holding its ep ranks (ep 2 or 4
    dividing both E and the shard), each a valid layout."""
    from lm_accounting.plan import _families

    cfg = MIXTRAL.with_context(16)
    fams = [f for f in _families(cfg, 16, (64, 64), 64) if f["replicate"] > 1 and f["ep"] > 1]
    assert {(f["dp"] // f["replicate"], f["ep"]) for f in fams} == {(2, 2), (4, 2), (4, 4), (8, 2), (8, 4)}
    assert all(f["zero"] in (2, 3) and f["pp"] == 1 and f["tp"] == 1 and f["dp"] == 64 for f in fams)
    for f in fams:
        ParallelLayout(**f, micro_batches=1).check(cfg, 16)


PRICED = ModelConfig(
    vocab_size=101, context_length=32, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48,
    num_experts=4, experts_per_token=2, name="priced-moe",
)  # fmt: skip  # head_dim 8: the step-time model prices fused attention at it


def test_plan_prices_each_group_over_its_own_ring():
    """64 GPUs, (replicate, shard, ep) = (8, 8, 4), amp-bf16, zero 3, one micro-batch.  Within the node (NVLink):
    the dense units over the shard group of 8 (bf16 all-gathers twice, fp32 reduce-scatter, each 7/8 of its
    payload) and the expert units over their 2 ranks (1/2 each).  Across the nodes (one rank of each replica
    group per node: one NIC, ``DEFAULT_INTERNODE``): the all-reduces of both units' fp32 shards over the 8
    replicas, 2·7/8 each.  The all-to-alls over the 4 ep ranks, on NVLink: T·k·d·2 bytes per call, 3/4 on the
    wire, 4 forward and 4 backward."""
    from lm_accounting.gpus import gpu
    from lm_accounting.plan import DEFAULT_INTERNODE, price_layout

    setup = TrainingSetup(attention="sdpa", precision="amp-bf16")
    lay = _lay(8, 8, 4)
    st = model_states(PRICED, setup, lay)  # its gathered bytes are bf16; the reduced ones fp32, twice as many
    experts = st.unsharded_experts  # the expert units' G_e, over 2 ranks; their R_e = 2·G_e
    dense = st.unsharded_all - st.unsharded_experts  # the dense units' G, over 8 ranks; R = 2·G
    within = 2 * (dense * 7 // 8) + (dense * 2) * 7 // 8 + 2 * (experts // 2) + (experts * 2) // 2
    across = 2 * ((dense * 2 // 8) * 7 // 8) + 2 * ((experts * 2 // 2) * 7 // 8)
    nvlink = gpu("h100-80gb").interconnect_one_way
    times = price_layout(PRICED, "h100-80gb", 32, 1, setup, lay)
    assert times[1] == pytest.approx(within / nvlink + across / DEFAULT_INTERNODE, rel=1e-12)
    alltoall = 32 * 2 * 32 * 2  # T·k·d·2
    assert times[4] == pytest.approx(8 * (alltoall * 3 // 4) / nvlink, rel=1e-12)
    # the same 64 ranks as one FSDP2 × EP job: the dense units' group spans the 8 nodes
    assert price_layout(PRICED, "h100-80gb", 32, 1, setup, ParallelLayout(dp=64, zero=3, ep=4))[1] > times[1]


@pytest.mark.slow
def test_plan_finds_what_the_brute_force_finds_and_every_floor_is_below_its_peak(monkeypatch):
    """A tiny MoE over 8..64 GPUs, an allowance that leaves about 400 kB of the H100 (so most candidates do not
    fit and the floors matter): with pruning off every candidate is replayed; the pruned search ranks the same
    fitting layouts with the same figures, among them HSDP × EP ones, and every HSDP × EP candidate's floor
    (``rank_floor``) is at most its replayed peak."""
    import lm_accounting.plan as pl
    from lm_accounting.analytic.parallel import rank_floor

    args = (PRICED, "h100-80gb", (8, 64), 32, 32 * 256, 32 * 256 * 10)
    allowance = 84_943_715_696 - 400_000  # the H100's CUDA total less 400 kB
    pruned = pl.plan(*args, top=10**6, allowance=allowance)
    peak, seen = pl._peak, []

    def checked(cfg, seq, b, setup, lay):
        v = peak(cfg, seq, b, setup, lay)
        seen.append((rank_floor(cfg, seq, b, setup, lay), v, lay))
        return v

    monkeypatch.setattr(pl, "_peak", checked)
    brute = pl.plan(*args, top=10**6, allowance=allowance, prune=False)
    assert brute.complete and pruned.ranked == brute.ranked
    both = [(f, v) for f, v, lay in seen if lay.replicate > 1 and lay.ep > 1]
    assert len(both) > 100 and all(f <= v for f, v in both)
    fit = [c for c in brute.ranked if c.layout.replicate > 1 and c.layout.ep > 1]
    assert fit and len(fit) < len(both) and all(c.peak_exact for c in fit)
