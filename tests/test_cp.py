"""Context parallel as a layout (``--cp``; ``parallelisms.cp``, ``analytic.context_parallel``): one CP rank of our
model measured on the fake process group on CPU tensors (torch 2.13's ``context_parallel`` with the CPU-kernel patch,
``measure.context_parallel.measure_cp_rank``) against the prediction, per phase; the refusals; FLOPs and collectives
written out by hand."""

import dataclasses

import pytest

from lm_accounting.analytic.collectives import totals
from lm_accounting.analytic.context_parallel import cp_rank_flops, cp_rank_step, rank_collectives
from lm_accounting.analytic.hardware_flops import step_flops
from lm_accounting.analytic.parallel import rank_step
from lm_accounting.config import AccountingError, load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

SDPA = TrainingSetup(attention="sdpa")


def tiny(seq: int = 256, kv: int = 4, d_ff: int = 32, vocab: int = 16):
    """Two Llama blocks, d 64, 4 heads of 16 (kv K/V heads), a small vocabulary and FFN: the attention's ring,
    not the LM head, can set the backward peak."""
    cfg = load_config("llama-3-8b")
    cfg = dataclasses.replace(
        cfg, num_layers=2, d_model=64, num_heads=4, num_kv_heads=kv, head_dim=16, d_ff=d_ff, vocab_size=vocab,
        tie_embeddings=False,
    )  # fmt: skip
    return cfg.with_context(seq)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(cp=2, pp=2, micro_batches=2), "beside pipeline parallel"),
        (dict(dp=4, zero=3, cp=2, ep=2), "beside expert parallel"),
    ],
)
def test_what_cp_is_not_accounted_beside_is_one_line(kwargs, message):
    with pytest.raises(AccountingError, match=message) as exc:
        ParallelLayout(**kwargs)
    assert "\n" not in str(exc.value)


def test_cp_refuses_what_it_cannot_shard():
    cfg = tiny(96)
    with pytest.raises(AccountingError, match="2·cp = 8 chunks: use a multiple of 8"):
        cp_rank_step(cfg, 96 + 4, 1, SDPA, ParallelLayout(cp=4))  # 100 positions: not 8 equal chunks
    with pytest.raises(AccountingError, match="use --attention sdpa"):
        cp_rank_step(cfg, 96, 1, TrainingSetup(), ParallelLayout(cp=2))
    with pytest.raises(AccountingError, match="selective checkpointing is not measured"):
        cp_rank_step(cfg, 96, 1, TrainingSetup(attention="sdpa", checkpoint="selective"), ParallelLayout(cp=2))
    from lm_accounting.analytic.parallel_report import parallel_memory

    op = TrainingSetup(attention="sdpa", checkpoint="op")  # the replay models no op step: refused all the same
    with pytest.raises(AccountingError, match="op checkpointing is not measured"):
        parallel_memory(cfg, 96, 1, op, ParallelLayout(dp=2, zero=3, cp=2))
    moe = dataclasses.replace(load_config("qwen3-30b-a3b"), num_layers=2).with_context(512)
    with pytest.raises(AccountingError, match="covers dense attention"):
        cp_rank_step(moe, 512, 1, SDPA, ParallelLayout(dp=2, zero=3, cp=2))


def test_cli_cp_refusal_is_exit_2():
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "lm_accounting", "memory", "gpt2-small", "--context", "1000", "--attention", "sdpa"]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    for extra, message in [(["--cp", "16"], "use a multiple of 32"), (["--cp", "2", "--pp", "2"], "not accounted")]:
        proc = subprocess.run(cmd + extra, capture_output=True, text=True, check=False, env=env)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_the_flat_layout_and_label():
    """torchtitan's mesh (dp, cp): FSDP2 over the flattened dp·cp ranks; world dp·cp."""
    lay = ParallelLayout(dp=2, zero=3, cp=4)
    assert lay.world == 8 and lay.label == "dp2·zero3·cp4"
    assert lay.flat_cp() == ParallelLayout(dp=8, zero=3)


def test_flops_by_hand():
    """A rank's QKᵀ and AV: 1/cp of the S² square (full-square convention) = cp·s²; the rest at s positions."""
    cfg, S, cp = tiny(256), 256, 4
    s, L, h, dh = S // cp, 2, 4, 16
    got = cp_rank_flops(cfg, S, 1, SDPA, ParallelLayout(cp=cp))
    # QKᵀ and AV over the whole S×S square: 2·S·S·h·dh each, 4·S²·h·dh a layer; a rank's 1/cp of it
    attention = L * 4 * S * S * h * dh // cp
    plain = step_flops(cfg, s, 1, SDPA).forward - L * 4 * s * s * h * dh  # the s-position model without attention
    assert got.forward == plain + attention


def _by_hand(cfg, S, setup, lay):
    """Rule 13 per layer, from ``_attention.py``: KV = 2·B·h_kv·s·dh·a gathered (cp·KV) in the forward, the
    backward and a full checkpoint's recompute; dKV fp32, cp ring shifts.  TP: the rank's h_kv/tp heads."""
    s, L, cp, h_kv = S // lay.cp, cfg.num_layers, lay.cp, cfg.kv_heads // lay.tp
    a = 4 if setup.precision == "fp32" else 2
    kv, dkv = 2 * h_kv * s * cfg.d_head * a, 2 * h_kv * s * cfg.d_head * 4
    gathers = (3 if setup.checkpoint == "full" else 2) * L
    return {"all_gather": (gathers, gathers * cp * kv), "all_to_all": (L * cp, L * cp * dkv)}


GRID = [  # (cp, dp, zero, precision, kv heads, checkpointing, tp, sp, vp): TP rows under FSDP2 (DDP takes no DTensor)
    (2, 1, 0, "fp32", 2, "none"),
    (4, 1, 0, "fp32", 4, "none"),
    (2, 1, 0, "amp-bf16", 4, "none"),
    (2, 2, 3, "fp32", 4, "none"),
    (4, 2, 3, "amp-bf16", 4, "none"),
    (4, 1, 2, "fp32", 2, "none"),
    (8, 1, 3, "fp32", 4, "none"),
    (4, 1, 0, "fp32", 4, "full"),
    (2, 2, 3, "fp32", 4, "full"),
    (2, 1, 3, "fp32", 4, "none", 2),
    (2, 2, 3, "amp-bf16", 4, "none", 2),
    (4, 1, 3, "fp32", 4, "full", 2),
    # beside sequence parallel (torchtitan's ``apply_tp`` with ``SequenceParallel`` norms, then CP): cp 2 · tp 2
    # and dp 2 · cp 2 · tp 2, fp32 and amp-bf16, none and full checkpointing; GQA with one K/V head a TP rank
    (2, 1, 3, "fp32", 4, "none", 2, True),
    (2, 1, 3, "amp-bf16", 4, "none", 2, True),
    (2, 1, 3, "fp32", 4, "full", 2, True),
    (2, 1, 3, "amp-bf16", 4, "full", 2, True),
    (2, 2, 3, "fp32", 4, "none", 2, True),
    (2, 2, 3, "amp-bf16", 4, "full", 2, True),
    (2, 2, 2, "fp32", 4, "full", 2, True),
    (2, 2, 2, "amp-bf16", 4, "none", 2, True),
    (2, 1, 3, "fp32", 2, "none", 2, True),
    (4, 1, 3, "amp-bf16", 2, "none", 2, True),
    # beside vocab parallel (torchtitan's loss parallel), with and without sequence parallel
    (2, 1, 3, "fp32", 4, "none", 2, True, True),
    (2, 2, 3, "amp-bf16", 4, "full", 2, True, True),
    (2, 1, 2, "fp32", 4, "full", 2, True, True),
    (2, 1, 3, "amp-bf16", 4, "full", 2, False, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("row", GRID)
def test_a_cp_rank_measured_on_the_fake_process_group(row):
    """Every rank (its cp rank's load-balanced branches): baseline, model states and every phase's peak and end
    exact; each peak at least the flattened layout's at s positions (the ring only adds); the CP collectives by
    hand, the FSDP2/DDP ones over dp·cp as the flattened layout's."""
    pytest.importorskip("torch")
    from lm_accounting.measure.context_parallel import measure_cp_rank
    from lm_accounting.measure.distributed import measure_rank

    cp, dp, zero, precision, kv, checkpoint, tp, sp, vp = (*row, *(1, False, False)[len(row) - 6 :])
    cfg, S = tiny(1024, kv), 1024
    setup = TrainingSetup(attention="sdpa", precision=precision, checkpoint=checkpoint)
    lay = ParallelLayout(dp=dp, zero=zero, cp=cp, tp=tp, sequence_parallel=sp, vocab_parallel=vp)
    flat = rank_step(cfg, S // cp, 1, setup, lay.flat_cp(), mode="traced", rank=0)[0]
    for rank in range(lay.world):
        m = measure_cp_rank(cfg, S, 1, setup, lay, rank=rank)
        want, st, _ = cp_rank_step(cfg, S, 1, setup, lay, mode="traced", rank=rank)
        assert m.step.baseline == want.baseline
        assert (m.params, m.gradients) == (st.parameters, st.gradients)
        for phase in ("forward", "backward", "optimizer_step"):
            got = getattr(m.step, phase)
            assert got == getattr(want, phase), (rank, phase)
            assert got.peak >= getattr(flat, phase).peak, (rank, phase)
    worst = cp_rank_step(cfg, S, 1, setup, lay, mode="traced")[0]  # the default: each phase's worst cp rank
    ranks = [c * tp for c in range(cp)]  # cp ranks 0..cp−1 of dp rank 0 (tp apart)
    assert worst.peak == max(cp_rank_step(cfg, S, 1, setup, lay, mode="traced", rank=r)[0].peak for r in ranks)
    by_group = [c for c in rank_collectives(cfg, S, 1, setup, lay) if c.group == "cp"]
    assert totals(by_group) == _by_hand(cfg, S, setup, lay)  # the rule's own figures, by hand
    flat_job = measure_rank(cfg, S // cp, 1, setup, lay.flat_cp(), rank=0)
    flat_measured = flat_job.collectives
    cp_measured = {k: (n - flat_measured.get(k, (0, 0))[0], b - flat_measured.get(k, (0, 0))[1])
                   for k, (n, b) in m.collectives.items()}  # fmt: skip
    # the kernels the ring runs beyond the s-position model's one: cp − 1 of s·s/2 each (a half of K or of q,
    # load-balanced), torch's counts 4·b·h·sq·sk·d forward, 10·… backward (its recompute of QKᵀ), a full
    # checkpoint's recompute the forward's again
    s, h, dh = S // cp, cfg.num_heads // tp, cfg.d_head
    ring = cfg.num_layers * (cp - 1) * s * (s // 2) * h * dh * (4 + 10 + (4 if checkpoint == "full" else 0))
    assert m.local_flops - flat_job.local_flops == ring
    assert {k: v for k, v in cp_measured.items() if v != (0, 0)} == _by_hand(cfg, S, setup, lay)
    assert m.collectives == totals(rank_collectives(cfg, S, 1, setup, lay))


@pytest.mark.parametrize("kv", [1, 4])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
@pytest.mark.parametrize("checkpoint", ["none", "full"])
def test_the_ring_in_the_hand_written_replay_is_the_op_librarys(kv, cp, precision, checkpoint):
    """The ring as ``analytic.replay`` runs it (``RingDeltas`` spliced into its blocks: what a sequence- or
    vocab-parallel rank is replayed with) against the op library's program with the ring installed
    (``op_library_step``), two independent programs of the same rank without SP: every phase's peak equal, on every
    cp rank, for one- and two-GPU-rank FSDP2 and B 1 and 2."""
    from lm_accounting.analytic.context_parallel import op_library_step
    from lm_accounting.analytic.ops.aten_ring import Ring, installed

    cfg, s = tiny(512, kv), 512 // cp
    setup = TrainingSetup(attention="sdpa", precision=precision, checkpoint=checkpoint)
    for flat in (ParallelLayout(), ParallelLayout(dp=2, zero=3)):
        for batch in (1, 2):
            for c in range(cp):
                library = op_library_step(cfg, s, batch, setup, flat, "traced", "meta", Ring(cp, c))
                with installed(Ring(cp, c)):
                    replay = rank_step(cfg, s, batch, setup, flat, "traced", 0)[0]
                shift = replay.baseline - library.baseline
                for phase in ("forward", "backward"):
                    assert getattr(replay, phase).peak == getattr(library, phase).peak + shift, (flat, batch, c, phase)


def test_the_cp_ring_time_by_hand():
    """Llama-3-8B, dp 4 × cp 2 on 8 H100s (one node: NVLink), S 64k, full checkpointing, amp-bf16: the cp ring's
    seconds (the tensor-parallel slot; no TP beside CP) are its wire bytes over NVLink, written out: per layer the
    all-gathers of cp·KV (forward, recompute, backward) send (cp − 1)/cp of them, the cp shifts of the fp32 dK, dV
    their whole buffer."""
    from lm_accounting.gpus import gpu
    from lm_accounting.plan import estimate_step

    cfg, S, cp = load_config("llama-3-8b").with_context(65536), 65536, 2
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")
    lay = ParallelLayout(dp=4, zero=3, cp=cp)
    s = S // cp
    kv, dkv = 2 * 8 * s * 128 * 2, 2 * 8 * s * 128 * 4  # 8 KV heads of 128, bf16; fp32 gradients
    wire = 32 * (3 * cp * kv * (cp - 1) // cp + cp * dkv)
    e = estimate_step(cfg, "h100-80gb", S, 1, setup, lay)
    assert e.times[2] == pytest.approx(wire / gpu("h100-80gb").interconnect_one_way, rel=1e-12)
    assert e.gpus == 8


def test_published_cp_rows():
    """The CP rows beside data parallel are predicted; Llama 3 405B's CP beside PP is not, and says why."""
    from lm_accounting.analytic.published_runs import RUNS, compare

    rows = {r.name: compare(r) for r in RUNS if r.cp > 1}
    assert rows["TT T2 8B FSDP 4 CP 2, S 64k"]["layout"] == "dp4·zero3·cp2"
    assert rows["NeMo LLAMA3-8B 8 GPUs CP 2"]["predicted_tokens_per_s"] is not None
    row = rows["Llama 3 405B 16,384 GPUs TP 8 CP 16 PP 16 DP 8"]
    assert row["predicted_tokens_per_s"] is None and "beside PP, no prediction" in row["cause"]


def test_plan_prices_your_own_cp_layout():
    """``plan --dp 4 --zero 3 --cp 2``: that layout only, every micro-batch and checkpointing but selective (refused
    under CP), its per-GPU need the worst CP rank's peak plus the allowance, labelled exact (the ring replayed)."""
    from lm_accounting.plan import OwnLayout, plan

    cfg = load_config("llama-3-8b").with_context(65536)
    lay = ParallelLayout(dp=4, zero=3, cp=2)
    got = plan(cfg, "h100-80gb", (8, 8), 65536, 262144, 10**12, own=OwnLayout(lay))
    assert {c.layout.label for c in got.ranked} == {"dp4·zero3·cp2"}
    c = got.ranked[0]
    assert c.checkpoint in ("none", "full") and c.peak_exact
    setup = TrainingSetup(attention="sdpa", checkpoint=c.checkpoint, precision="amp-bf16")
    peak = cp_rank_step(cfg, 65536, c.micro_batch, setup, lay)[0].peak
    assert c.per_gpu == peak + got.allowance


def _ring_peaks(cp: int, rank: int, kv: int, dtype, rotate: str) -> dict[str, int]:
    """One causal attention (B 1, 4 heads of 16, kv K/V heads, s = 64 positions a rank; q, k, v transposed views of
    (B, s, heads, 16) leaves, as the model's) on rank ``rank`` of a cp-rank ring on the fake process group,
    traced: each phase's peak above its start (forward: the op; backward: the gradient seed, the ring's backward,
    the leaves' gradients)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    from lm_accounting.measure.context_parallel import FLASH_CPU, install, ring_tracker
    from lm_accounting.measure.distributed import init_fake_group

    install()
    set_rotate_method(rotate)
    init_fake_group(cp, rank)
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=(f"ring{cp}_{rank}_{kv}_{dtype}_{rotate}",))
    leaves = [torch.randn(1, 64, n, 16, dtype=dtype, requires_grad=True) for n in (4, kv, kv)]
    level, peaks, start = [0], {}, {}

    def hear(phase, op, delta, device):
        start.setdefault(phase, level[0])
        level[0] += delta
        peaks[phase] = max(peaks.get(phase, 0), level[0] - start[phase])

    tracker = ring_tracker(listener=hear)
    try:
        with context_parallel(mesh, buffers=[torch.zeros(1, 64 * cp)], buffer_seq_dims=[1]), tracker:
            with tracker.phase("forward"):
                shards = (DTensor.from_local(t.transpose(1, 2), mesh, [Shard(2)], run_check=False) for t in leaves)
                out = getattr(torch.ops.aten, FLASH_CPU)(*shards, 0.0, True)[0].to_local()
            with tracker.phase("backward"):
                out.backward(torch.ones_like(out))
    finally:
        set_rotate_method("allgather")
    return peaks


def _ring_replayed(cp: int, rank: int, kv: int, dtype: str, rotate: str) -> dict[str, int]:
    """``_ring_peaks``' program in the op library with cp rank ``rank``'s ring installed (``ops.aten_ring``)."""
    from lm_accounting.analytic.ops import aten as A
    from lm_accounting.analytic.ops.aten_flash import flash_attention_for_cpu
    from lm_accounting.analytic.ops.aten_ring import Ring, installed
    from lm_accounting.analytic.ops.tensors import Run, backward, parameter

    with Run(traced=True) as run, installed(Ring(cp, rank, rotate)):
        leaves = [parameter((1, 64, n, 16), dtype) for n in (4, kv, kv)]
        start = run.phase().end.at(1)  # the leaves: made before the tracker
        out = flash_attention_for_cpu(*(A.transpose(t, 1, 2) for t in leaves))[0]
        forward = run.phase()
        backward(out)
        back = run.phase()
    return {"forward": forward.peak.at(1) - start, "backward": back.peak.at(1) - forward.end.at(1)}


@pytest.mark.slow
@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
@pytest.mark.parametrize("kv", [1, 4])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("cp", [2, 4, 8])
def test_one_ring_attention_replayed_on_every_rank(cp, dtype, kv, rotate):
    """What one ring attention allocates, forward and backward, replayed (``ops.aten_ring``) equal to the fake-PG
    run's on every rank (the load-balanced branches differ by rank), both rotate methods."""
    torch = pytest.importorskip("torch")

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    for rank in range(cp):
        assert _ring_peaks(cp, rank, kv, dt, rotate) == _ring_replayed(cp, rank, kv, dtype, rotate), rank


@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
@pytest.mark.parametrize(("cp", "dtype"), [(2, "float32"), (4, "bfloat16")])
def test_rule_13_against_one_measured_attention_layer(rotate, cp, dtype):
    """``cp_collectives`` for one layer (2 heads of 8, 2 K/V heads, B 1) against the collectives one rank of
    tests/test_context_parallel.py's attention layer issues on the fake process group, per kind and phase."""
    torch = pytest.importorskip("torch")
    from test_context_parallel import run_rank

    from lm_accounting.analytic.context_parallel import cp_collectives

    calls, _ = run_rank(cp, 1, 16 * cp, rotate, getattr(torch, dtype))
    cfg = dataclasses.replace(tiny(16 * cp, 2), num_layers=1, d_model=16, num_heads=2, head_dim=8)
    setup = TrainingSetup(attention="sdpa", precision="fp32" if dtype == "float32" else "bf16")
    lay = ParallelLayout(cp=cp)
    want: dict = {}
    for c in cp_collectives(cfg, 16 * cp, 1, setup, lay, rotate):
        n, b = want.get((c.kind, c.phase), (0, 0))
        want[(c.kind, c.phase)] = (n + c.count, b + c.payload)
    got: dict = {}
    for kind, nbytes, phase in calls:
        n, b = got.get((kind, phase), (0, 0))
        got[(kind, phase)] = (n + 1, b + nbytes)
    assert got == want
