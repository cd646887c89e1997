"""torchtitan's per-op selective checkpointing (``--checkpoint op``) under data parallel (DDP, ZeRO-1, FSDP2
ZeRO-2/3): one rank of the op library's course program (``analytic.ops.data_parallel.op_rank_step``, which
``analytic.parallel.rank_step`` hands ``op`` to) equals one rank of our live model on torch's fake process group
(``measure.distributed.measure_rank``: FSDP2 on FakeTensors, DDP and ZeRO-1 on real CPU tensors), phase by phase,
with its model states and collectives; and the course program under these layouts is the legacy replay's
(``rank_step``, proven against the same job) for the policies that replay has, on a CUDA target too."""

import dataclasses
import itertools

import pytest

from lm_accounting.analytic.collectives import step_collectives, totals
from lm_accounting.analytic.ops import predict_step
from lm_accounting.analytic.parallel import rank_step
from lm_accounting.config import AccountingError, ModelConfig, load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

# vocab 101 shards unevenly over 2 and 4 ranks (51, 50; 26, 26, 26, 23 rows): rank 0 is FSDP2's worst
TINY = ModelConfig(
    vocab_size=101, context_length=16, num_layers=3, d_model=24, num_heads=4, num_kv_heads=2, d_ff=40, name="tiny"
)
MOE = dataclasses.replace(TINY, num_experts=4, experts_per_token=2, expert_d_ff=8, name="tiny-moe")
MHA = dataclasses.replace(TINY, num_kv_heads=4)  # a CUDA target refuses fp32 with grouped K/V heads
S, B = 16, 2


def label(x) -> str:
    return x.name if isinstance(x, ModelConfig) else x.label


def layouts(dp: int) -> list[ParallelLayout]:
    return [ParallelLayout(dp=dp, zero=z) for z in (0, 1, 2, 3)]


# -- the course program under data parallel is the legacy replay's, for the policies that replay has ------------
LEGACY_CASES = [
    (TrainingSetup(attention=a, checkpoint=c, precision=p), lay, run)
    for a, c, p in itertools.product(("naive", "sdpa"), ("none", "full", "selective"), ("fp32", "amp-bf16"))
    for lay in layouts(4)
    for run in (("traced", "meta"), ("plain", "cpu"), ("plain", "cuda"))
]


@pytest.mark.parametrize(
    "setup, layout, run", LEGACY_CASES, ids=lambda x: "-".join(x) if isinstance(x, tuple) else label(x)
)
def test_course_program_under_data_parallel_is_the_legacy_replay(setup, layout, run):
    """DDP and ZeRO-1 (``ops.ddp.Replicate`` over our model: the worst ZeRO-1 rank) and FSDP2 (``ops.fsdp``, on
    CUDA with rule 9's launch metadata) over the course program equal ``rank_step``, the worst rank, which
    tests/test_parallel_measured.py and tests/test_fsdp_replay.py prove against the fake-PG job."""
    mode, device = run
    legacy, st, _ = rank_step(MHA, S, B, setup, layout, mode=mode, device=device)
    from lm_accounting.analytic.ops.ddp import Replicate

    rep = None if layout.fsdp else Replicate(layout, rank=st.rank)
    ours = predict_step(MHA, S, setup, impl="course", batch=B, layout=layout, mode=mode, device=device, replicate=rep)
    assert ours.at(B) == legacy


# -- op against the fake process group ---------------------------------------------------------------------------
OP_SETUPS = [
    TrainingSetup(attention=a, checkpoint="op", precision=p)
    for a, p in itertools.product(("naive", "sdpa"), ("fp32", "amp-bf16"))
]
OP_CASES = [
    (cfg, setup, lay)
    for cfg in (TINY, MOE)
    for setup in OP_SETUPS
    for lay in (ParallelLayout(dp=2, zero=0), ParallelLayout(dp=4, zero=1), ParallelLayout(dp=2, zero=2))
    + (ParallelLayout(dp=4, zero=2), ParallelLayout(dp=4, zero=3))
]


@pytest.mark.parametrize("cfg, setup, layout", OP_CASES, ids=label)
def test_op_rank_equals_the_fake_pg_job(cfg, setup, layout):
    """Every phase's peak and end, the model states and the collectives (the first step's: DDP's one bucket per
    dtype) of the worst rank."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    step, st, _ = rank_step(cfg, S, B, setup, layout, mode="traced")
    got = measure_rank(cfg, S, B, setup, layout, rank=st.rank, fake=layout.fsdp)
    assert got.step == step
    assert (got.params, got.gradients, got.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert got.collectives == totals(step_collectives(cfg, S, B, setup, layout, rank=st.rank, first_step=True))


@pytest.mark.parametrize("layout", [ParallelLayout(dp=2, zero=2), ParallelLayout(dp=4, zero=3)], ids=label)
def test_op_plain_cpu_rank_equals_the_cpu_allocator(layout):
    """The plain run (no dispatch mode) read from the CPU allocator, as ``memory --measure cpu --measure-method
    allocator`` measures it, against ``rank_step(mode="plain", device="cpu")`` at the run's threads."""
    torch = pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank_plain

    setup = TrainingSetup(attention="sdpa", checkpoint="op", precision="amp-bf16")
    want, st, _ = rank_step(TINY, S, B, setup, layout, "plain", None, "cpu", torch.get_num_threads())
    assert measure_rank_plain(TINY, S, B, setup, layout, rank=st.rank) == want


def test_op_saves_between_full_and_none_by_hand():
    """The saved activations of the ZeRO-3 rank (fp32, naive attention, one layer's difference): ``op`` keeps
    every matmul output but every second one (``course.sac``), so below ``none`` and above ``full``, and the
    figure does not depend on the sharding (ZeRO-2 and DDP report ZeRO-3's and the single step's)."""
    cfg, setup = TINY, TrainingSetup(checkpoint="op")
    acts = {z: rank_step(cfg, S, B, setup, ParallelLayout(dp=4, zero=z), mode="traced")[2] for z in (0, 2, 3)}
    assert acts[0] == acts[2] == acts[3]
    one = predict_step(cfg, S, setup, impl="course", batch=B, mode="traced").at(B)
    assert acts[3] == one.forward.end - one.baseline  # what one GPU's forward leaves live
    none, full = (
        rank_step(cfg, S, B, dataclasses.replace(setup, checkpoint=c), ParallelLayout(dp=4, zero=3))[2]
        for c in ("none", "full")
    )
    assert full < acts[3] < none


@pytest.mark.parametrize(
    "layout", [ParallelLayout(tp=2, sequence_parallel=True), ParallelLayout(dp=2, zero=3, tp=2, sequence_parallel=True)]
)
def test_sequence_parallel_reduce_scatters_under_op_equal_the_fake_pg_job(layout):
    """``analytic.collectives`` rule 4: under ``op`` the recompute reruns the sequence-parallel all-gathers but not
    the MLP's reduce-scatter (its output is a saved matmul's), so L fewer backward reduce-scatters than under
    ``selective`` (L = 3 here); counted on the fake process group (``op``'s per-rank memory beside TP stays not
    modelled: only the collectives are compared)."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    got = {}
    for ck in ("selective", "op"):
        setup = TrainingSetup(attention="sdpa", checkpoint=ck, precision="amp-bf16")
        got[ck] = measure_rank(TINY, S, B, setup, layout).collectives
        assert got[ck] == totals(step_collectives(TINY, S, B, setup, layout, first_step=True)), ck
    assert got["selective"]["reduce_scatter"][0] - got["op"]["reduce_scatter"][0] == TINY.num_layers


@pytest.mark.parametrize(
    "layout, match",
    [
        (ParallelLayout(dp=2, zero=3, tp=2), "not under TP"),
        (ParallelLayout(dp=4, zero=3, replicate=2), "not under HSDP"),
    ],
)
def test_op_under_other_parallelisms_is_named_not_modelled(layout, match):
    from lm_accounting.analytic.parallel_report import parallel_memory

    cfg = dataclasses.replace(TINY, num_heads=4, num_kv_heads=4)
    result = parallel_memory(cfg, S, B, TrainingSetup(checkpoint="op"), layout)
    assert result.step is None and any(match in line for line in result.not_modelled)
    with pytest.raises(AccountingError, match=match):
        rank_step(cfg, S, B, TrainingSetup(checkpoint="op"), layout)


SMALL = ["llama-3-8b", "--set", "d_model=64", "--set", "num_heads=4", "--set", "num_kv_heads=2", "--set", "d_ff=96"]
SMALL += [
    "--set",
    "vocab_size=256",
    "--layers",
    "2",
    "--context",
    "32",
    "--attention",
    "sdpa",
    "--precision",
    "amp-bf16",
]


@pytest.mark.parametrize("flags", [["--dp", "4", "--zero", "1"], ["--dp", "4", "--zero", "3"]], ids=" ".join)
def test_memory_cli_measures_op_under_data_parallel(run_cli, flags):
    """``memory --checkpoint op`` with a data-parallel layout: the rank's phases, measured on the fake process group
    (the worst ZeRO-1 rank; FSDP2 on FakeTensors), with its states and collectives, and nothing left unmodelled."""
    import json

    pytest.importorskip("torch")
    r = run_cli("memory", *SMALL, "--checkpoint", "op", *flags, "--measure", "meta", "--format", "json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    m = d["measured"]
    assert d["not_modelled"] == [] and m["rank"] == d["worst_rank"]["data_parallel_rank"]
    assert m["step"] == d["step_traced"] and m["optimizer_state"] == d["per_gpu"]["optimizer_state"]
    want: dict[str, list[int]] = {}
    for c in d["collectives"]:
        entry = want.setdefault(c["kind"], [0, 0])
        entry[0], entry[1] = entry[0] + c["count"], entry[1] + c["payload_bytes"]
    assert {k: [v["count"], v["payload_bytes"]] for k, v in m["collectives"].items()} == want
    assert d["step"] is not None and d["per_gpu"]["saved_activations"] > 0  # the plain (CUDA) run is predicted too


def test_memory_cli_names_what_op_is_not_modelled_beside(run_cli):
    r = run_cli("memory", *SMALL, "--checkpoint", "op", "--dp", "2", "--zero", "3", "--tp", "2")
    assert r.code == 0 and "NOT MODELLED" in r.out and "not under TP" in r.out, r.err
    r = run_cli("memory", *SMALL, "--checkpoint", "op", "--dp", "4", "--zero", "3", "--rank", "1")
    assert r.code == 2 and "replayed for rank 0" in r.err and r.err.count("\n") == 1, r.err


def test_op_refuses_a_micro_batch_whose_expert_split_is_uneven_in_one_line():
    """Qwen3-30B-A3B at S 1,000: 1,000 · 8 = 8,000 routed slots a sequence over 128 experts (62.5 each).  The rank's
    lines in B need the split even for every B, so B >= 2 is refused in one line (``plan`` skips that candidate);
    B = 1 is replayed."""
    cfg = load_config("qwen3-30b-a3b").with_context(1000)
    assert 1000 * cfg.experts_per_token % cfg.num_experts != 0
    setup = TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="op")
    lay = ParallelLayout(dp=64, zero=3)
    assert rank_step(cfg, 1000, 1, setup, lay, mode="plain")[0].peak > 0
    with pytest.raises(AccountingError, match="split evenly over the experts; use --batch 1"):
        rank_step(cfg, 1000, 2, setup, lay, mode="plain")
