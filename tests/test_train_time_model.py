"""Issue 28, items 1 and 3: one calibrated step-time model (``plan.estimate_step``) behind ``plan``, ``train-time``
and ``memory`` with a layout.  A small layout's step written out by hand (its compute from the calibrated single-GPU
step of the TP-local model, one TP collective rule at NVLink's bandwidth, data-parallel collectives hidden behind the
compute and then longer than it), the three commands' JSON for one job, ``--efficiency``, and the one-line refusals."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from lm_accounting.analytic.step_time import CALIBRATION_DIR, Program, load, predict_step_time
from lm_accounting.config import ModelConfig
from lm_accounting.layout import ParallelLayout
from lm_accounting.plan import estimate_step, ring_bandwidth
from lm_accounting.setup import TrainingSetup

SMALL = ModelConfig(vocab_size=64, context_length=32, num_layers=2, d_model=16, num_heads=2, d_ff=32, name="small")
AMP = TrainingSetup(attention="sdpa", precision="amp-bf16")
NVLINK = 450e9  # H100 SXM: NVLink 4, 900 GB/s bidirectional, 450 GB/s one way (gpus.py)


def test_a_gemm_at_its_calibrated_rate_in_a_compiled_program():
    """The compiled program (what ``plan`` prices at every micro-batch) prices a GEMM at a grid point at its row's
    seconds: a GEMM whose m is a line in B (2,048·B tokens) at the row of m = 2,048 at B = 1 and of m = 8,192 at
    B = 4."""
    with (CALIBRATION_DIR / "h100-80gb" / "gemm.csv").open(newline="") as fh:
        grid = {(r["layout"], int(r["m"]), int(r["n"]), int(r["k"])): float(r["seconds"]) for r in csv.DictReader(fh)
                if r["dtype"] == "bfloat16"}  # fmt: skip
    from lm_accounting.analytic.ops.engine import Affine

    work = [("phase", 1), ("gemm", 3, "bf16", "nt", 1, Affine(2048, 0), 4096, 4096), ("phase", 1), ("phase", 1)]
    program = Program.compile(work)
    at_one, _ = program.at(1, load("h100-80gb"))
    at_four, _ = program.at(4, load("h100-80gb"))
    assert at_one[1].gemm == pytest.approx(3 * grid["nt", 2048, 4096, 4096], rel=1e-12)
    assert at_four[1].gemm == pytest.approx(3 * grid["nt", 8192, 4096, 4096], rel=1e-12)


def test_a_small_tensor_parallel_step_by_hand():
    """tp = 2, one micro-batch of b = 2 sequences of S = 32 (T = 64 tokens), amp-bf16, no data parallel.
    Compute: the TP-local model (h/2 = 1 head, 1 KV head, d_ff/2 = 16) runs whole on each rank, so its calibrated
    single-GPU forward + backward + AdamW is the compute (the busiest rank's FLOPs share is 1: no vocab parallel).
    TP collectives (collectives rule 3): forward 2·L all-reduces of T·d·2 bytes (bf16 activations), backward 5·L of
    T·d·4 (fp32 input gradients); an all-reduce over 2 ranks puts 2·(2 - 1)/2 = 1 payload on the wire, at
    NVLink's one-way bandwidth, exposed: step = compute + TP."""
    local = dataclasses.replace(SMALL, num_heads=1, num_kv_heads=1, head_dim=8, d_ff=16)
    t = predict_step_time(local, 32, AMP, impl="course", batch=2)
    compute = t.forward.seconds + t.backward.seconds + t.optimizer_step
    tp_wire = 2 * 2 * 64 * 16 * 2 + 5 * 2 * 64 * 16 * 4  # 8,192 + 40,960 bytes
    e = estimate_step(SMALL, "h100-80gb", 32, 2, AMP, ParallelLayout(tp=2))
    assert e.times[0] == pytest.approx(compute, rel=1e-12)
    assert e.times[2] == pytest.approx(tp_wire / NVLINK, rel=1e-12)
    assert e.step_seconds == pytest.approx(compute + tp_wire / NVLINK, rel=1e-12)
    assert e.exposed_communication == pytest.approx(tp_wire / NVLINK, rel=1e-9)
    gemm, attention, other, bubble = e.parts
    assert gemm + attention + other == pytest.approx(compute, rel=1e-12) and abs(bubble) < 1e-15


def test_data_parallel_collectives_overlap_the_compute_until_they_are_longer():
    """FSDP2 ZeRO 3 over 16 ranks (two nodes): 7,248 parameters (tests/test_plan.py), every row count divisible by
    16 (no padding); all-gathers of the bf16 parameters twice (forward and backward), a reduce-scatter of the fp32
    gradients once, 15/16 of each on the wire.  The 16 ranks are 8 on each node: NCCL's rings, one per NIC, carry
    them at 8 NICs × the inter-node link (8 × 50 = 400 GB/s, under NVLink's 450).  Rule 3 overlaps them with
    the compute: at 50 GB/s per NIC they hide behind it (step = compute); at 1 MB/s they are longer (step = their
    time, over 8 × 1 MB/s)."""
    lay = ParallelLayout(dp=16, zero=3)
    wire = 2 * (2 * 7_248 * 15 // 16) + 4 * 7_248 * 15 // 16
    fast = estimate_step(SMALL, "h100-80gb", 32, 2, AMP, lay)
    assert fast.times[1] == pytest.approx(wire / 400e9, rel=1e-12) and fast.times[1] < fast.times[0]
    assert fast.step_seconds == fast.times[0] and fast.exposed_communication == 0
    slow = estimate_step(SMALL, "h100-80gb", 32, 2, AMP, lay, internode_bw=10**6)
    assert slow.times[0] == fast.times[0] and slow.step_seconds == pytest.approx(wire / 8e6, rel=1e-12)
    # AdamW over a 16th of the states: the compute is the whole model's forward + backward and that share
    t = predict_step_time(SMALL, 32, AMP, impl="course", batch=2)
    assert fast.times[0] == pytest.approx(t.forward.seconds + t.backward.seconds + t.optimizer_step / 16, rel=1e-12)


def test_a_ring_spanning_nodes_runs_at_its_ranks_per_node_times_the_nic():
    """Rule 3's ring bus bandwidth (``plan.ring_bandwidth``), by hand on 8-GPU H100 nodes (NVLink 450 GB/s one
    way) with 50 GB/s NICs, one per GPU: a group inside a node runs on NVLink; across nodes each of its ranks on a
    node brings one NIC (ranks stride apart: 8 // stride of them per node, at most the group), capped by NVLink."""
    link = lambda ranks, stride, nic=50e9: ring_bandwidth(ranks, stride, NVLINK, nic)
    assert link(8, 1) == 450e9  # one node
    assert link(4, 2) == 450e9  # dp 4 beside tp 2: ranks 0, 2, 4, 6
    assert link(16, 1) == 400e9  # 8 ranks a node: 8 NICs
    assert link(64, 2) == 200e9  # beside tp 2: 4 ranks a node
    assert link(64, 8) == 50e9  # beside tp 8: one rank a node, one NIC
    assert link(2, 8) == 50e9  # dp 2 beside tp 8: two nodes, one NIC each
    assert link(16, 1, nic=100e9) == 450e9  # 8 × 100 GB/s, capped by NVLink


MODEL = ("llama-3-8b", "--set", "num_layers=2")
KEYS = ("step_seconds", "model_flops_per_step", "hardware_flops_per_step", "mfu", "hfu", "breakdown")


def cli_json(run_cli, *args) -> dict:
    r = run_cli(*args, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_plan_train_time_and_memory_print_the_same_step(run_cli):
    """One job (Llama-3-8B's first 2 layers, S 1,024, 2 sequences a step on one H100, sdpa, amp-bf16, foreach
    AdamW, no checkpointing) through the three commands: the same step, FLOPs, MFU, HFU and breakdown."""
    plan = cli_json(run_cli, "plan", *MODEL, "--context", "1024", "--global-batch-tokens", "2048",
                    "--tokens", "2048000", "--dp", "1", "--checkpoint", "none", "--micro-batch", "2")  # fmt: skip
    train = cli_json(run_cli, "train-time", *MODEL, "-S", "1024", "-B", "2", "--attention", "sdpa",
                     "--precision", "amp-bf16", "--gpu", "h100-sxm")  # fmt: skip
    memory = cli_json(run_cli, "memory", *MODEL, "-S", "1024", "-B", "2", "--dp", "1", "--attention", "sdpa",
                      "--precision", "amp-bf16")  # fmt: skip
    best = plan["best"][0]
    assert best["gpus"] == 1 and best["micro_batch"] == 2 and best["accumulation"] == 1
    for key in KEYS:
        assert best[key] == train[key] == memory["step_time"][key], key
    assert 0 < train["mfu"] <= train["hfu"] < 1
    assert train["days"] == pytest.approx(train["step_seconds"] * 400_000 / 86_400, rel=1e-12)


def test_efficiency_scales_the_compute_and_says_so(run_cli):
    args = (*MODEL, "-S", "1024", "-B", "2", "--attention", "sdpa", "--precision", "amp-bf16", "--gpu", "h100-sxm")
    base = cli_json(run_cli, "train-time", *args)
    fast = cli_json(run_cli, "train-time", *args, "--efficiency", "1.25")
    assert fast["efficiency"] == 1.25 and base["efficiency"] == 1
    assert fast["step_seconds"] == pytest.approx(base["step_seconds"] / 1.25, rel=1e-12)  # one GPU: all compute
    assert fast["mfu"] == pytest.approx(base["mfu"] * 1.25, rel=1e-12)
    assert "--efficiency 1.25 (applied)" in run_cli("train-time", *args, "--efficiency", "1.25").out
    assert "applied" not in run_cli("train-time", *args).out


def test_a_gpu_without_a_table_is_priced_on_the_scaled_h100_and_says_so(run_cli):
    """The A100 80GB: GEMMs and attention at the H100's seconds × 989.4 / 312 (dense bf16 peaks), memory-bound
    kernels and AdamW at × 3,350 / 2,039 GB/s (HBM), per gpus.py; the per-kernel time kept."""
    h100, a100 = load("h100-80gb"), load("a100-80gb")
    assert a100.scaled_from and "scaled from the H100 calibration" in a100.label
    key = next(iter(h100.gemm[("bfloat16", "nt")]))
    assert a100.gemm["bfloat16", "nt"][key] == pytest.approx(h100.gemm["bfloat16", "nt"][key] * 989.4 / 312)
    assert a100.bandwidth == pytest.approx(h100.bandwidth * 2_039 / 3_350)
    assert a100.kernel_overhead == h100.kernel_overhead
    out = run_cli("train-time", "gpt2-small", "-S", "256", "--gpu", "a100").out
    assert "a100-80gb scaled from the H100 calibration" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (("train-time", "gpt2-small", "-S", "256", "--efficiency", "0"), "--efficiency must be in (0, 1.5], got 0.0"),
        (("train-time", "gpt2-small", "-S", "256", "--efficiency", "nan"), "--efficiency must be in (0, 1.5], got nan"),
        (("plan", "llama-3-8b", "--tokens", "10", "--efficiency", "2"), "--efficiency must be in (0, 1.5], got 2.0"),
        (("train-time", "gpt2-small", "-S", "256", "--mfu", "0.5"), "No such option '--mfu'"),
        (
            ("plan", "llama-3-8b", "--tokens", "10", "--gpu", "v100"),
            "v100 has no bf16 (its datasheet's tensor cores take fp16, which lm-accounting does not train in)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_cli, args, message):
    r = run_cli(*args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
