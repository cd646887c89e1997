"""Context parallel beside HSDP (``--cp`` with ``--replicate``; torchtitan's dp_replicate × dp_shard × cp): FSDP2 over
the 2-D (dp_replicate, dp_shard_cp) mesh, the ring over cp.  Each rank's states, every phase's peak and end and every
collective (count, bytes, phase and the ranks it ran over) against one rank of the real job on the fake process group
(``measure.context_parallel.measure_cp_rank``); the states and the collectives' split written out by hand."""

import pytest
from test_cp import tiny

from lm_accounting.analytic.collectives import totals
from lm_accounting.analytic.context_parallel import cp_rank_step, rank_collectives
from lm_accounting.analytic.parallel import model_states
from lm_accounting.config import AccountingError
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

S = 1024


def test_the_layout_its_groups_and_refusals():
    """dp 4 = replicate 2 × dp_shard 2, cp 2: 8 GPUs, FSDP2's shard group dp_shard·cp = 4 ranks; dp_shard 1 (dp = r)
    is a shard group of the cp ranks, which torchtitan runs; a replicate that does not divide dp is refused."""
    from lm_accounting.parallelisms import group_ranks

    lay = ParallelLayout(dp=4, zero=3, cp=2, replicate=2, tp=2)
    assert (lay.world, lay.shard, lay.label) == (16, 4, "dp4·zero3·hsdp2x4·cp2·tp2")
    # (ranks, stride) on the (dp_replicate, dp_shard, cp, tp) mesh: cp tp apart, the shard group's dp_shard·cp ranks
    # tp apart, the replicas dp_shard·cp·tp = 8 apart
    assert group_ranks(lay, "cp") == (2, 2)
    assert group_ranks(lay, "dp_shard_cp") == (4, 2)
    assert group_ranks(lay, "dp_replicate") == (2, 8)
    assert ParallelLayout(dp=2, zero=3, cp=2, replicate=2).shard == 2
    with pytest.raises(AccountingError, match="does not divide dp"):
        ParallelLayout(dp=4, zero=3, cp=2, replicate=3)
    with pytest.raises(AccountingError, match="use --zero 2 or 3"):
        ParallelLayout(dp=4, zero=1, cp=2, replicate=2)


def test_states_and_collectives_by_hand():
    """tiny(): 2 blocks of 4·64·64 (q, k, v, o) + 3·32·64 (w1, w3, w2) + 2·64 (norms) = 22,656 elements, the root
    2·16·64 + 64 = 2,112: N = 47,424, every row count a multiple of 4.  HSDP 2 × (dp_shard 2 · cp 2), fp32: each rank
    holds N/4 of the parameters (N·4/4 = 47,424 B), not N/8 as FSDP2 over all 8 ranks would.  Collectives of rank 0,
    zero 3, none: the 3 units gathered twice over dp_shard_cp (2·N·4 B), reduce-scattered once (N·4 B), each unit's
    shard all-reduced over dp_replicate (N·4/4 B in all); the ring's over cp (tests/test_cp.py's rule 13)."""
    cfg, N = tiny(S), 47424
    lay, setup = ParallelLayout(dp=4, zero=3, cp=2, replicate=2), TrainingSetup(attention="sdpa")
    st = model_states(cfg, setup, lay.flat_cp(), rank=0)
    assert (st.parameters, st.gradients, st.optimizer) == (N, N, 2 * N)
    got = {}
    for c in rank_collectives(cfg, S, 1, setup, lay):
        n, b = got.get((c.kind, c.group), (0, 0))
        got[(c.kind, c.group)] = (n + c.count, b + c.payload)
    L, kv = 2, 2 * 4 * (S // 2) * 16 * 4  # K and V of the rank's s = S/cp positions, 4 heads of 16, fp32
    assert got == {
        ("all_gather", "dp_shard_cp"): (6, 2 * N * 4),
        ("reduce_scatter", "dp_shard_cp"): (3, N * 4),
        ("all_reduce", "dp_replicate"): (3, N * 4 // 4),
        ("all_gather", "cp"): (2 * L, 2 * L * 2 * kv),
        ("all_to_all", "cp"): (L * 2, L * 2 * kv),  # cp shifts of the fp32 dK, dV a layer (fp32: dKV = KV)
    }


def _ranks_of(group: str, lay: ParallelLayout, rank: int) -> tuple[int, ...]:
    """The global ranks of ``rank``'s ``group`` on torchtitan's (dp_replicate, dp_shard, cp, tp) mesh, written out:
    rank = ((i·s + j)·cp + c)·tp + t; dp_shard_cp holds (j, c) of one (i, t), dp_replicate i of one (j, c, t)."""
    s, cp, t = lay.dp // lay.replicate, lay.cp, lay.tp
    i, rest = divmod(rank, s * cp * t)
    j, rest = divmod(rest, cp * t)
    c, k = divmod(rest, t)
    if group == "cp":
        return tuple(((i * s + j) * cp + x) * t + k for x in range(cp))
    if group == "dp_shard_cp":
        return tuple(i * s * cp * t + x * t + k for x in range(s * cp))
    if group == "dp_replicate":
        return tuple(((x * s + j) * cp + c) * t + k for x in range(lay.replicate))
    assert group == "tp"
    return tuple(rank - k + x for x in range(t))


GRID = [  # (dp, replicate, cp, tp, zero, precision, checkpointing, vocab, extra): worlds 4, 8 and 16; vocab 101
    # shards unevenly over a shard group of 4 (26 rows, the last rank's 23) and 2 (51, 50)
    (4, 2, 2, 1, 3, "fp32", "none", 16, {}),
    (4, 2, 2, 1, 3, "amp-bf16", "full", 101, {}),
    (4, 2, 2, 1, 2, "fp32", "full", 101, {}),
    (4, 2, 2, 2, 3, "fp32", "full", 16, {}),
    (4, 2, 2, 2, 3, "amp-bf16", "none", 101, {}),
    (4, 2, 2, 2, 2, "amp-bf16", "full", 16, {"sequence_parallel": True}),
    (4, 2, 2, 2, 3, "fp32", "none", 16, {"sequence_parallel": True, "vocab_parallel": True}),
    (2, 2, 4, 1, 3, "fp32", "none", 16, {}),  # dp_shard 1: the shard group is the cp ranks
    (2, 2, 2, 2, 3, "amp-bf16", "full", 101, {}),
    (2, 2, 2, 1, 2, "amp-bf16", "none", 101, {}),
]


@pytest.mark.grid
@pytest.mark.parametrize("row", GRID, ids=lambda r: "-".join(map(str, r[:8])) + "".join(f"-{k}" for k in r[8]))
def test_a_cp_hsdp_rank_on_the_fake_process_group(row):
    """Rank 0 and the last rank (the last replica's last shard rank, cp rank cp − 1): states, baseline, every phase's
    peak and end, and every collective bucketed by (kind, phase, the ranks it ran over)."""
    pytest.importorskip("torch")
    from lm_accounting.measure.context_parallel import measure_cp_rank

    dp, r, cp, tp, zero, precision, checkpoint, vocab, extra = row
    cfg = tiny(S, vocab=vocab)
    setup = TrainingSetup(attention="sdpa", precision=precision, checkpoint=checkpoint)
    lay = ParallelLayout(dp=dp, zero=zero, cp=cp, replicate=r, tp=tp, **extra)
    for rank in (0, lay.world - 1):
        m = measure_cp_rank(cfg, S, 1, setup, lay, rank=rank)
        want, st, _ = cp_rank_step(cfg, S, 1, setup, lay, mode="traced", rank=rank)
        assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer), rank
        assert m.step == want, rank
        got: dict = {}
        for (kind, nbytes, phase), ranks in zip(m.calls, m.groups, strict=True):
            n, b = got.get((kind, phase, ranks), (0, 0))
            got[(kind, phase, ranks)] = (n + 1, b + nbytes)
        expected: dict = {}
        predicted = rank_collectives(cfg, S, 1, setup, lay, rank=rank // tp)
        for c in predicted:
            key = (c.kind, c.phase, _ranks_of(c.group, lay, rank))
            n, b = expected.get(key, (0, 0))
            expected[key] = (n + c.count, b + c.payload)
        assert got == expected, rank
        assert m.collectives == totals(predicted)


def test_plan_prices_your_own_cp_hsdp_layout():
    """``plan --dp 4 --zero 3 --cp 2 --replicate 2``: that layout only, its per-GPU need the worst CP rank's peak (its
    shard group's FSDP2 rank at S/cp, the ring replayed) plus the allowance, exact; its states over dp_shard·cp = 4
    ranks, twice the plain dp4·zero3·cp2's (over 8)."""
    from lm_accounting.config import load_config
    from lm_accounting.plan import OwnLayout, plan

    cfg = load_config("llama-3-8b").with_context(32768)
    got = {}
    for r in (1, 2):
        lay = ParallelLayout(dp=4, zero=3, cp=2, replicate=r)
        result = plan(cfg, "h100-80gb", (8, 8), 32768, 262144, 10**12, own=OwnLayout(lay, checkpoint="full"))
        (c,) = [c for c in result.ranked if c.micro_batch == 1]
        assert c.layout.label == lay.label and c.peak_exact
        setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")
        step, st, _ = cp_rank_step(cfg, 32768, 1, setup, c.layout)
        assert c.per_gpu == step.peak + result.allowance
        got[r] = (c.per_gpu, st.parameters, st.optimizer)
    # Llama 3 8B's rows all divide by 8: a shard over 4 ranks is exactly twice one over 8
    assert got[2][1:] == (2 * got[1][1], 2 * got[1][2]) and got[2][0] > got[1][0]


@pytest.mark.slow
def test_llama_405b_at_128k_on_16k_gpus_considers_cp_beside_hsdp():
    """Issue 27: ``plan llama-3.1-405b --gpus 16384 -S 131072 --global-batch-tokens 16777216`` (128 sequences of
    128K: dp <= 128).  Without pp, tp 8 and cp 16 give dp 128; HSDP beside them is dp_shard 1 (dp_shard·tp <= 8):
    128 replicas of a shard group of the 16 cp ranks, FSDP2's states over 16 ranks, not 2,048.  It fits, exact, its
    need the replay's peak plus the allowance."""
    from lm_accounting.config import load_config
    from lm_accounting.gpus import gpu
    from lm_accounting.plan import plan

    cfg = load_config("llama-3.1-405b").with_context(131072)
    result = plan(cfg, "h100-80gb", (16384, 16384), 131072, 16 * 1024 * 1024, 10**12, top=10**6)
    hsdp = [c for c in result.ranked if c.layout.replicate > 1]
    assert hsdp and {(c.layout.cp, c.layout.tp, c.layout.replicate, c.layout.shard) for c in hsdp} == {(16, 8, 128, 16)}
    for c in hsdp:
        setup = TrainingSetup(attention="sdpa", checkpoint=c.checkpoint, precision="amp-bf16")
        peak = cp_rank_step(cfg, 131072, c.micro_batch, setup, c.layout)[0].peak
        assert c.per_gpu == peak + result.allowance <= gpu("h100-80gb").cuda_total and c.peak_exact


@pytest.mark.slow
def test_memory_measures_a_cp_hsdp_rank_and_compares_every_collective(run_cli, tmp_path):
    """``memory FILE --dp 2 --zero 3 --replicate 2 --cp 2 --measure meta --rank 3``: the table of the first step's
    collectives, predicted against measured on the fake process group, holds the ring's
    (all-to-alls of dK, dV; K, V all-gathers) beside FSDP2's: by hand for tiny (2 layers, 4 K/V heads of 16, S 256,
    fp32), the 2·L ring all-gathers and L·cp all-to-alls beside the 2·3 FSDP2 all-gathers."""
    pytest.importorskip("torch")
    path = tmp_path / "tiny.toml"
    path.write_text(
        "vocab_size = 16\ncontext_length = 256\nnum_layers = 2\nd_model = 64\nnum_heads = 4\nnum_kv_heads = 4\n"
        'd_ff = 32\ntie_embeddings = false\nname = "tiny"\n'
    )
    args = ["memory", path, "-S", "256", "--dp", "2", "--zero", "3", "--replicate", "2", "--cp", "2"]
    r = run_cli(*args, "--measure", "meta", "--rank", "3")
    assert r.code == 0, r.err
    table = r.out.split("predicted vs measured")[1].split("\n\n")[0]
    rows = {line.split()[0]: line.split()[1:3] for line in table.splitlines()[3:] if line.strip()}
    assert rows["all_gather"] == ["10", "10"] and rows["all_to_all"] == ["4", "4"]  # 2·3 + 2·L; L·cp
    assert rows["reduce_scatter"] == ["3", "3"] and rows["all_reduce"] == ["3", "3"]  # a unit each, over 3 units
