"""``lm_accounting.parallelisms`` (issue 27, a slice): each parallelism's rules in its own module, behind one
protocol; ``ParallelLayout`` applies them.  Their refusals are tested where each layout is (tests/test_layout*.py,
tests/test_hsdp.py, ...); here, what the registry itself promises."""

from __future__ import annotations

import dataclasses

import pytest

from lm_accounting.analytic.collectives import step_collectives
from lm_accounting.config import AccountingError, load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.parallelisms import PARALLELISMS, group_ranks
from lm_accounting.setup import TrainingSetup


def test_every_layout_field_is_some_parallelisms():
    """A field no parallelism reads would be a degree nothing validates, labels or prices."""
    declared = {f for p in PARALLELISMS for f in p.fields}
    assert declared == {f.name for f in dataclasses.fields(ParallelLayout)}


def test_the_label_names_each_running_parallelism_in_order():
    lay = ParallelLayout(dp=8, zero=3, tp=2, sequence_parallel=True, vocab_parallel=True, pp=4, micro_batches=8)
    assert lay.label == "dp8·zero3·tp2+sp+vp·pp4x8"
    assert ParallelLayout(dp=16, zero=3, replicate=2).label == "dp16·zero3·hsdp2x8"
    assert ParallelLayout(dp=8, zero=2, ep=4, pp=2, micro_batches=2, virtual_stages=2).label == (
        "dp8·zero2·ep4·pp2x2v2"
    )
    assert ParallelLayout().label == "dp1·zero0"


def test_each_group_on_the_mesh_written_out():
    """(ranks, stride) on the (pp, dp, tp) mesh, by hand: dp 16 × tp 8 with HSDP r 2 (shard groups of 8 dp ranks,
    8 apart; the 2 replicas 64 apart); dp 8 × tp 2 with ep 4 (the all-to-alls over 4 consecutive dp ranks, 2 apart;
    the expert units over the 2 ranks holding the same experts, 8 apart); neighbouring pipeline stages dp·tp apart."""
    hsdp = ParallelLayout(dp=16, zero=3, tp=8, replicate=2)
    assert group_ranks(hsdp, "dp_shard") == (8, 8) and group_ranks(hsdp, "dp_replicate") == (2, 64)
    assert group_ranks(hsdp, "tp") == (8, 1)
    ep = ParallelLayout(dp=8, zero=2, tp=2, ep=4)
    assert group_ranks(ep, "ep") == (4, 2) and group_ranks(ep, "dp/ep") == (2, 8) and group_ranks(ep, "dp") == (8, 2)
    assert group_ranks(ParallelLayout(dp=2, tp=4, pp=4, micro_batches=4), "pp") == (2, 8)
    with pytest.raises(KeyError, match="runs the process group 'tp'"):
        group_ranks(ParallelLayout(dp=8, zero=3), "tp")


@pytest.mark.parametrize(
    "layout",
    [
        ParallelLayout(dp=8, zero=0, tp=2),
        ParallelLayout(dp=8, zero=1, tp=2, sequence_parallel=True),
        ParallelLayout(dp=4, zero=3, tp=2, sequence_parallel=True, vocab_parallel=True, pp=2, micro_batches=4),
        ParallelLayout(dp=8, zero=3, replicate=2),
        ParallelLayout(dp=4, zero=2, pp=2, micro_batches=4, virtual_stages=2),
    ],
    ids=lambda lay: lay.label,
)
def test_every_collective_runs_over_a_group_some_parallelism_declares(layout):
    """Each collective of a step (``analytic.collectives``) names a process group that a running parallelism
    declares, its ranks spanning no more of the mesh than the job's GPUs."""
    cfg = dataclasses.replace(load_config("llama-3-8b"), num_layers=4, tie_embeddings=False).with_context(1024)
    setup = TrainingSetup(attention="sdpa", precision="amp-bf16")
    groups = {c.group for c in step_collectives(cfg, 1024, 1, setup, layout)}
    assert groups
    for g in groups:
        ranks, stride = group_ranks(layout, g)
        assert ranks >= 2 and ranks * stride <= layout.world, (g, ranks, stride)  # the group fits on the mesh


def test_moe_collectives_groups_are_declared():
    cfg = dataclasses.replace(load_config("qwen3-30b-a3b"), num_layers=2).with_context(512)
    layout = ParallelLayout(dp=8, zero=3, ep=4)
    groups = {c.group for c in step_collectives(cfg, 512, 1, TrainingSetup(attention="sdpa"), layout)}
    assert groups == {"dp", "dp/ep", "ep"}
    assert all(group_ranks(layout, g)[0] <= 8 for g in groups)


def test_each_refusal_is_one_line_from_its_parallelism():
    for kwargs, message in [
        (dict(sequence_parallel=True), "sequence parallel needs tp > 1"),
        (dict(vocab_parallel=True), "vocab parallel needs tp > 1"),
        (dict(pp=4, micro_batches=2), "1F1B with pp=4 needs at least 4 micro-batches"),
        (dict(dp=4, zero=1, ep=2), "ep=2 needs FSDP2"),
        (dict(dp=4, zero=3, replicate=4), "leaves shard groups of one rank"),
        (dict(zero=5), "zero stage must be 0, 1, 2 or 3"),
    ]:
        with pytest.raises(AccountingError, match=message) as exc:
            ParallelLayout(**kwargs)
        assert "\n" not in str(exc.value)


def test_op_checkpointing_saves_the_sequence_parallel_reduce_scatter():
    """Rule 4 under torchtitan's per-op SAC: its ``_save_list`` holds ``_c10d_functional.reduce_scatter_tensor``, so
    the recompute reruns the 2L all-gathers (not saved) but none of the L reduce-scatters ``selective`` reruns.  Llama-
    3-8B, tp 8 with SP, S 8,192, B 1, amp-bf16: L = 32 reduce-scatters of T·d·a = 8,192·4,096·2 bytes fewer."""
    from lm_accounting.analytic.collectives import tensor_parallel_collectives
    from lm_accounting.config import load_config
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.setup import TrainingSetup

    cfg, lay = load_config("llama-3-8b"), ParallelLayout(tp=8, sequence_parallel=True)
    got = {
        ck: {(c.kind, c.phase): (c.count, c.payload) for c in tensor_parallel_collectives(
            cfg, 8192, 1, TrainingSetup(attention="sdpa", checkpoint=ck, precision="amp-bf16"), lay)}
        for ck in ("selective", "op")
    }  # fmt: skip
    sel, op = got["selective"], got["op"]
    assert sel[("reduce_scatter", "backward")][0] - op[("reduce_scatter", "backward")][0] == 32
    assert sel[("reduce_scatter", "backward")][1] - op[("reduce_scatter", "backward")][1] == 32 * 8192 * 4096 * 2
    assert {k: v for k, v in sel.items() if k != ("reduce_scatter", "backward")} == {
        k: v for k, v in op.items() if k != ("reduce_scatter", "backward")
    }
