"""``plan``: enumeration speed without torch, one candidate's step time written out by hand, and
the one-line errors."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_views import key_paths

from lm_accounting.analytic.step_time import predict_step_time
from lm_accounting.config import ModelConfig
from lm_accounting.gpus import gpu
from lm_accounting.plan import plan
from lm_accounting.setup import TrainingSetup

SMALL = ModelConfig(vocab_size=64, context_length=32, num_layers=2, d_model=16, num_heads=2, d_ff=32, name="small")


def test_one_candidate_by_hand():
    p = plan(SMALL, "h100-80gb", (8, 8), 32, 512, 512 * 10, top=10**6)
    (c,) = [c for c in p.ranked if c.layout.label == "dp8·zero3" and c.checkpoint == "none" and c.micro_batch == 2]
    # 512 tokens = 16 sequences of 32; dp 8 → 2 per rank: micro-batch 2, one micro-batch (k = 1).
    assert c.accumulation == 1
    # Forward matmul FLOPs at B = 2, S = 32 (T = 64), h = 2, d_head = 8, d_ff = 32, V = 64:
    #   q, k, v, o: 4 · 2·64·16·16 = 131,072 per layer; QKᵀ and AV: 2 · 2·2·2·32²·8 = 131,072;
    #   SwiGLU: 6·64·16·32 = 196,608 → 458,752 per layer, 917,504 for 2; LM head 2·64·16·64 = 131,072.
    forward = 917_504 + 131_072
    # Hardware FLOPs: 3 × forward + the fused backward's QKᵀ recompute, 2·2·2·32²·8 per layer.
    hardware = 3 * forward + 2 * 65_536
    h100 = gpu("h100-80gb")
    assert p.row(c)["hardware_flops_per_step"] == hardware
    # Compute: tp = 1, so the rank runs the whole model: its calibrated forward + backward at b = 2 (analytic.step_time,
    # priced op by op; tests/test_step_time.py prices one by hand), and AdamW over its eighth of the states (ZeRO 3).
    setup = TrainingSetup(attention="sdpa", checkpoint="none", precision="amp-bf16")
    t = predict_step_time(SMALL, 32, setup, impl="course", batch=2)
    assert c.compute_s == pytest.approx(t.forward.seconds + t.backward.seconds + t.optimizer_step / 8, rel=1e-12)
    # FSDP2 zero 3 over 8 ranks, no padding (16, 32 and 64 rows all divide by 8).  Parameters:
    # 2·64·16 + 2·(16 + 4·16·16 + 16 + 3·16·32) + 16 = 7,248.  All-gathers in bf16 (2 bytes), twice
    # (forward and backward): 2 · 14,496 · 7/8; reduce-scatter in fp32 once: 28,992 · 7/8.
    wire = 2 * (14_496 * 7 // 8) + 28_992 * 7 // 8
    assert c.dp_comm_s == pytest.approx(wire / h100.interconnect_one_way, rel=1e-12)  # one node: NVLink
    assert c.tp_comm_s == 0 and c.step_s == max(c.compute_s, c.dp_comm_s)
    row = p.row(c)
    assert row["tokens_per_s"] == pytest.approx(512 / c.step_s)
    assert row["gpu_hours"] == pytest.approx(10 * c.step_s / 3600 * 8)


def test_plan_over_a_thousand_layouts_imports_no_torch():
    code = (
        "import sys, json\n"
        "from lm_accounting.config import load_config\n"
        "from lm_accounting.plan import plan\n"
        "cfg = load_config('llama-3.1-70b').with_context(8192)\n"
        "p = plan(cfg, 'h100-80gb', (8, 1024), 8192, 4 * 1024 * 1024, 15 * 10**12)\n"
        "print(json.dumps([p.evaluated, len(p.ranked),"
        " sorted({'torch', 'pandas', 'matplotlib'} & set(sys.modules))]))\n"
    )
    # the timeout is a hang guard only: the speed (issue 11: < 2 s) is measured by benchmarks/bench_cli.py plan-70b
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=600).stdout
    evaluated, fitting, heavy = json.loads(out)
    assert evaluated >= 1000 and fitting > 0 and heavy == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["llama-3.1-405b", "--gpus", "8..16", "--tokens", "10"], "fits no layout on 8..16 h100-80gb"),
        (["llama-3-8b", "--gpu", "h100x", "--tokens", "10"], "unknown GPU 'h100x'"),
        (["llama-3-8b", "--gpus", "16..8", "--tokens", "10"], "must satisfy 1 <= LOW <= HIGH"),
        (["llama-3-8b", "--global-batch-tokens", "1000", "--tokens", "10"], "not a whole number"),
        # Qwen3's 40,960-token context does not divide the default 4,194,304 (= 102.4 sequences): the two
        # nearest global batches, 102 and 103 sequences
        (["qwen3-0.6b", "--tokens", "10"], "give --global-batch-tokens 4,177,920 or 4,218,880, or a --context"),
        (["llama-3-8b", "--efficiency", "1.6", "--tokens", "10"], "--efficiency must be in (0, 1.5], got 1.6"),
        (["llama-3-8b", "--efficiency", "0", "--tokens", "10"], "--efficiency must be in (0, 1.5], got 0.0"),
    ],
)
def test_bad_plans_exit_2_with_one_line(run_cli, args, message):
    r = run_cli("plan", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err


def test_plan_json(run_cli):
    r = run_cli(
        "plan",
        "llama-3-8b",
        "--gpus",
        "8..64",
        "--context",
        "8192",
        "--tokens",
        "1000000000000",
        "--price-per-gpu-hour",
        "2",
        "--format",
        "json",
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["schema"] == "lm-accounting/plan/7" and len(data["best"]) == 10 and data["own_layout"] is None
    # the best 10 found before every candidate was checked: how many fit in all is not known
    assert data["candidates_checked"] < data["candidates_evaluated"] and data["candidates_fitting"] is None
    best = data["best"][0]
    assert best["per_gpu_bytes"] <= 84_943_715_696  # the H100 80GB's CUDA total, 79.11 GiB
    assert best["gpus"] <= 64
    pinned = json.loads((Path(__file__).parent / "snapshots" / "json_keys.json").read_text())["plan"]
    assert sorted(key_paths(data)) == pinned


def test_memory_vs_gpus_and_its_plot(tmp_path):
    from lm_accounting.config import load_config
    from lm_accounting.plan import memory_vs_gpus
    from lm_accounting.views.plan import plot_memory_vs_gpus

    cfg = load_config("llama-3-8b").with_context(8192)
    curves = memory_vs_gpus(cfg, 8192, (8, 64))
    zero3 = [b for _, b in curves["FSDP2 ZeRO-3"]]
    ddp = [b for _, b in curves["DDP"]]
    assert zero3 == sorted(zero3, reverse=True) and len(set(ddp)) == 1  # sharding helps; DDP replicates
    assert all(z < d for z, d in zip(zero3, ddp, strict=True))
    paths = plot_memory_vs_gpus(curves, 80 * 10**9, "test", tmp_path / "mem")
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "svg"]
    assert all((tmp_path / f"mem.{ext}").stat().st_size > 1000 for ext in ("png", "svg"))


def test_plan_csv_rows_name_the_model(run_cli):
    """Each CSV row names its model, GPU and context, so plans of several models concatenate."""
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(run_cli("plan", "llama-3-8b", "--tokens", "1e12", "--format", "csv").out)))
    assert rows and all((r["model"], r["gpu"], r["context"]) == ("llama-3-8b", "h100-80gb", "8192") for r in rows)


def test_plan_says_which_peaks_are_exact():
    """The peak column: exact where one rank of the fake-PG job has been shown to match (DDP, ZeRO, FSDP2,
    TP, SP, FSDP2 × TP: tests/test_parallel_measured.py, test_fsdp_replay.py; pipeline stages, alone or
    beside data, tensor and sequence parallel: tests/test_pipeline_*.py); an estimate for DDP / ZeRO-1 ×
    TP, with or without pipeline parallel (not run on the fake process group).  A mixture of experts under
    FSDP2's bf16 policy is replayed (tests/test_parallel_moe.py): exact at every ZeRO stage."""
    p = plan(SMALL, "h100-80gb", (8, 8), 32, 512, 512 * 10, top=10**6)
    for c in p.ranked:
        lay = c.layout
        ddp_tp = lay.tp > 1 and lay.dp > 1 and not lay.fsdp  # DDP / ZeRO-1 × TP: not run
        assert c.peak_exact == (not ddp_tp), lay.label
    assert {c.peak_exact for c in p.ranked} == {True, False}
    best = p.to_dict()["best"]
    assert [r["peak_exact"] for r in best] == [c.peak_exact for c in p.ranked[: len(best)]]
    moe = dataclasses.replace(SMALL, num_experts=4, experts_per_token=2, name="small-moe")
    m = plan(moe, "h100-80gb", (8, 8), 32, 512, 512 * 10, top=10**6)
    assert {(c.layout.zero, c.peak_exact) for c in m.ranked if c.layout.ep == 1} == {
        (0, True),
        (1, True),
        (2, True),
        (3, True),
    }


@pytest.mark.slow
def test_floors_are_lower_bounds_that_change_nothing(monkeypatch):
    """The planner skips the replay of a layout whose floor (``stage_floor``, ``rank_floor``) already
    exceeds the GPU.  Each floor is at most the replayed peak, on every candidate (pipeline stages
    alone and beside DDP, ZeRO, TP and SP, and the estimates beside DDP/ZeRO-1 × TP), and the plan is
    the same with the floors switched off: the same layouts fit, with the same figures.  The allowance
    is set so that most candidates do not fit (the floors then matter) and a few do."""
    import lm_accounting.plan as pl
    from lm_accounting.analytic.parallel import rank_floor
    from lm_accounting.analytic.pipeline import stage_floor

    cfg = dataclasses.replace(SMALL, num_layers=4, name="small4")
    peak, seen = pl._peak, []

    def checked(cfg, seq, b, setup, lay, stop_above=None):  # every stage replayed: the worst's peak
        v = peak(cfg, seq, b, setup, lay)
        seen.append(((stage_floor if lay.pp > 1 else rank_floor)(cfg, seq, b, setup, lay), v, lay.label))
        return v

    # the H100's CUDA total (79.11 GiB = 84,943,715,696 bytes) less 250 kB: most of these tiny peaks do not fit
    allowance = 84_943_715_696 - 250_000
    with_floors = plan(cfg, "h100-80gb", (8, 64), 32, 2048, 2048 * 10, top=10**6, allowance=allowance)
    monkeypatch.setattr(pl, "_peak", checked)
    monkeypatch.setattr(pl, "stage_floor", lambda *a: 0)
    monkeypatch.setattr(pl, "rank_floor", lambda *a: 0)
    without = plan(cfg, "h100-80gb", (8, 64), 32, 2048, 2048 * 10, top=10**6, allowance=allowance)
    assert len(seen) > 500 and any(label.count("pp") for _, _, label in seen)
    assert [(f, v, label) for f, v, label in seen if f > v] == []
    assert 0 < len(with_floors.ranked) < len(seen)
    assert sum(f > 250_000 for f, _, _ in seen) > 100  # floors that skip the replay
    assert [(c.layout, c.checkpoint, c.micro_batch, c.per_gpu) for c in with_floors.ranked] == [
        (c.layout, c.checkpoint, c.micro_batch, c.per_gpu) for c in without.ranked
    ]


@pytest.mark.slow
def test_the_best_found_first_are_the_best_of_all():
    """``plan`` ranks every candidate by its step time first and checks them against the GPU in that
    order until ``top`` fit: its answer is the first ``top`` of the ranking of every fitting candidate
    (``top`` at least their number checks them all).  The allowance leaves 120 kB of the GPU, so most of
    the best-ranked candidates do not fit and the search has to pass them."""
    cfg = dataclasses.replace(SMALL, num_layers=4, name="small4")
    args = (cfg, "h100-80gb", (8, 64), 32, 2048, 2048 * 10)
    allowance = 84_943_715_696 - 120_000  # the H100's CUDA total, 79.11 GiB, less 120 kB
    every = plan(*args, top=10**6, allowance=allowance)
    assert every.complete and every.checked == every.evaluated and 10 < len(every.ranked) < every.evaluated
    for top in (1, 3, 10):
        best = plan(*args, top=top, allowance=allowance)
        assert not best.complete and best.evaluated == every.evaluated
        assert best.ranked == every.ranked[:top] and best.checked > 50  # it passed candidates that do not fit
    # brute force: every candidate replayed (no floor, no micro-batch shortcut), the fitting ones ranked
    import lm_accounting.plan as pl
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.setup import TrainingSetup

    h100, fits = gpu("h100-80gb"), []
    for family in pl._families(cfg, 32, (8, 64), 64):  # 2048 tokens = 64 sequences of 32
        for b in pl._micro_batches(64 // family["dp"], family["pp"]):
            lay = ParallelLayout(**family, micro_batches=64 // family["dp"] // b)
            for ck in pl.PLANNED_CHECKPOINTS:  # plan's search: op under data parallel alone
                setup = TrainingSetup(attention="sdpa", checkpoint=ck, precision="amp-bf16")
                if ck == "op" and pl.not_modelled(cfg, 32, setup, lay):
                    continue
                need = pl._peak(cfg, 32, b, setup, lay) + allowance
                step = pl.step_seconds(*pl._Pricing(cfg, 32, h100, 1.0, 50e9).step_times(b, setup, lay))
                if need <= h100.cuda_total:
                    fits.append((step * lay.world, step, len(fits), lay, ck, b, need))
    assert [f[3:] for f in sorted(fits)] == [(c.layout, c.checkpoint, c.micro_batch, c.per_gpu) for c in every.ranked]
    assert any(c.layout.vocab_parallel for c in every.ranked)


def test_expert_parallel_compute_is_the_busiest_ranks():
    """Step 1 under expert parallel: the rank whose experts receive the most rows sets the step (6 experts,
    2 a token, over 2 ep ranks: the deterministic routing splits the rows unevenly), not the model's even
    share, which the planner priced before."""
    from lm_accounting.analytic.hardware_flops import step_flops
    from lm_accounting.analytic.parallel import rank_flops
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.plan import _Pricing
    from lm_accounting.setup import TrainingSetup

    moe = dataclasses.replace(SMALL, num_experts=6, experts_per_token=2, name="small-moe")
    lay, setup, h100 = (
        ParallelLayout(dp=4, zero=3, ep=2, micro_batches=2),
        TrainingSetup(precision="amp-bf16"),
        gpu("h100-80gb"),
    )
    per_rank = [rank_flops(moe, 32, 1, setup, lay, r).hardware for r in range(2)]
    even = rank_flops(moe, 32, 1, setup, ParallelLayout(dp=4, zero=3)).hardware
    assert min(per_rank) < even < max(per_rank)
    pricing = _Pricing(moe, 32, h100, 1.0, 50e9)
    compute = pricing.step_times(1, setup, lay)[0]
    # the whole model's calibrated forward + backward at b = 1, scaled by the busiest rank's share of its FLOPs
    t = predict_step_time(moe, 32, setup, impl="course", batch=1)
    whole = step_flops(moe, 32, 1, setup).hardware
    adamw = pricing.optimizer(setup, lay)
    assert compute == pytest.approx(2 * max(per_rank) / whole * (t.forward.seconds + t.backward.seconds) + adamw)


WIDE_VOCAB = ModelConfig(
    vocab_size=32000, context_length=512, num_layers=4, d_model=64, num_heads=8, d_ff=128, num_kv_heads=2,
    name="wide-vocab",
)  # fmt: skip


def random_floor_draws(seed: int, draws: int = 1000, cp_draws: int = 400) -> tuple[int, int]:
    """Issue 27's property on ``draws`` random layouts from ``random.Random(seed)`` (DDP, ZeRO-1/2/3 × TP ± SP ± VP
    × PP, every precision and checkpointing), and ``cp_draws`` under context parallel, of models whose logits
    matter (a 32,000-row vocabulary beside d_model 64): ``rank_floor`` and ``stage_floor`` never exceed the
    replayed peak; without PP the saved activations are exact: the replay's forward end less its baseline,
    plus, under FSDP2's ZeRO-2 (which keeps every unit unsharded from forward to backward), those units.  Under
    ``op`` (torchtitan's per-op policy, data parallel alone: the op library's course program) the floor takes
    ``full``'s saved activations, and the saved figure is not the legacy rules' (which have no ``op``).
    Returns (layouts whose saved activations were checked, pipeline layouts, ``op`` layouts)."""
    import random

    from lm_accounting.analytic.context_parallel import cp_rank_step
    from lm_accounting.analytic.parallel import rank_floor, rank_step, saved_activations
    from lm_accounting.analytic.pipeline import pipeline_stages, stage_floor
    from lm_accounting.config import AccountingError
    from lm_accounting.layout import ParallelLayout

    rng = random.Random(seed)
    models = [
        WIDE_VOCAB,
        ModelConfig(vocab_size=2000, context_length=512, num_layers=2, d_model=128, num_heads=4, d_ff=256, name="b"),
    ]
    checked = exact = stages = op = 0
    while checked < draws:
        cfg = rng.choice(models)
        tp = rng.choice([1, 2, 4])
        dp, pp = rng.choice([1, 2, 4, 32]), rng.choice([1, 1, 2])
        zero = rng.choice([0, 1, 2, 3]) if dp > 1 else 0
        sp, vp = tp > 1 and rng.random() < 0.5, tp > 1 and rng.random() < 0.5
        seq, batch = rng.choice([128, 256]), rng.choice([1, 2])
        setup = TrainingSetup(
            attention=rng.choice(["sdpa", "naive"]),
            checkpoint=rng.choice(["none", "full", "selective", "op"]),
            precision=rng.choice(["fp32", "bf16", "amp-bf16"]),
        )
        try:
            lay = ParallelLayout(dp=dp, zero=zero, tp=tp, sequence_parallel=sp, vocab_parallel=vp, pp=pp,
                                 micro_batches=2 * pp)  # fmt: skip
            if pp > 1:
                peak = pipeline_stages(cfg, seq, batch, setup, lay, with_traced=False)[1].peak  # as plan._peak
                floor = stage_floor(cfg, seq, batch, setup, lay)
            else:
                mem, st, saved = rank_step(cfg, seq, batch, setup, lay)
                peak, floor = mem.peak, rank_floor(cfg, seq, batch, setup, lay)
                held = st.unsharded_all if zero == 2 else 0  # ZeRO-2 keeps the gathered parameters past the forward
                assert setup.checkpoint == "op" or saved == saved_activations(cfg, seq, batch, setup, lay)
                assert mem.forward.end - mem.baseline == saved + held, (cfg.name, lay.label, setup, seq, batch)
                exact += 1
        except AccountingError:
            continue  # a layout the model or the replay refuses (e.g. heads not divisible)
        assert floor <= peak, (cfg.name, lay.label, setup, floor - peak)
        checked, stages, op = checked + 1, stages + (pp > 1), op + (setup.checkpoint == "op")
    # context parallel (plan's search enumerates it): plan's floor, the flattened dp·cp rank's at S/cp, against the
    # CP rank's peak, its ring replayed (as plan._peak), on random layouts of what CP runs beside (dp, tp ± SP ± VP,
    # HSDP's replicate r: FSDP2 over r groups of dp/r · cp ranks)
    rng, checked, hsdp = random.Random(seed * 101), 0, 0
    while checked < cp_draws:
        cfg, tp, dp, cp = rng.choice(models), rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 32]), rng.choice([2, 4, 8])
        seq, batch = rng.choice([128, 256]), rng.choice([1, 2])
        setup = TrainingSetup(
            attention="sdpa",
            checkpoint=rng.choice(["none", "full"]),
            precision=rng.choice(["fp32", "bf16", "amp-bf16"]),
        )
        try:
            sp, vp = tp > 1 and rng.random() < 0.5, tp > 1 and rng.random() < 0.5  # where parallelisms.cp takes them
            zero, r = rng.choice([0, 1, 2, 3]), rng.choice([1, 1, 2, 4])  # r > 1: HSDP where zero >= 2 and r | dp
            lay = ParallelLayout(dp=dp, zero=zero, tp=tp, cp=cp, micro_batches=rng.choice([1, 2]),
                                 sequence_parallel=sp, vocab_parallel=vp, replicate=r if zero >= 2 else 1)  # fmt: skip
            peak = cp_rank_step(cfg, seq, batch, setup, lay, mode="plain")[0].peak
            floor = rank_floor(cfg, seq // cp, batch, setup, lay.flat_cp())
        except AccountingError:
            continue
        assert floor <= peak, (cfg.name, lay.label, setup, floor - peak)
        checked, hsdp = checked + 1, hsdp + (lay.replicate > 1)
    assert hsdp > cp_draws // 10  # CP beside HSDP among the draws
    return exact, stages, op


@pytest.mark.slow
def test_floors_are_lower_bounds_on_random_layouts():
    """Issue 27: ``random_floor_draws`` on seed 27.  Before the fix, vocab parallel under FSDP2's amp added the
    full-vocabulary fp32 loss (2·T·V·2 bytes) to the saved activations: Llama-3-8B's floor was 2.63 GiB above
    its peak at dp32·zero3·tp8+sp+vp, and ``plan llama-3.1-70b --gpus 256`` dropped 8 layouts that fit."""
    exact, stages, op = random_floor_draws(27)
    assert exact > 500 and stages > 200 and op > 30


def test_vocab_parallel_under_fsdp2_amp_saves_the_blocks_fp32_exp():
    """Issue 27, a draw of another seed: dp4·zero3·tp2+sp+vp, naive attention, amp-bf16, S = 256.  Vocab
    parallel under FSDP2's amp had dropped the blocks' fp32 tensors with the full-vocabulary loss: the saved
    activations were 22,395,656 bytes, the forward end (replayed, and measured: ``memory ... --measure meta``)
    24,501,000 above the baseline; the floor held, the printed figure was low.  Hand count of what FSDP2's amp
    saves beyond the pure-bf16 job on this rank (L 4, B 1, h/tp = 4 heads, S 256, V/tp = 16,000 rows, T 256):
    the blocks' exp and its row sums in fp32, L·B·h·(S² + S)·(4 − 2) = 4·4·65,792·2 = 2,105,344, and the loss's
    fp32 log-softmax output, loss and weight, (T·V/tp + 2)·(4 − 2) = 8,192,004."""
    from lm_accounting.analytic.parallel import rank_floor, rank_step
    from lm_accounting.layout import ParallelLayout

    lay = ParallelLayout(dp=4, zero=3, tp=2, sequence_parallel=True, vocab_parallel=True)
    amp, bf16 = (TrainingSetup(attention="naive", checkpoint="none", precision=p) for p in ("amp-bf16", "bf16"))
    mem, _, saved = rank_step(WIDE_VOCAB, 256, 1, amp, lay)
    assert saved == mem.forward.end - mem.baseline == 24_501_000
    assert saved - rank_step(WIDE_VOCAB, 256, 1, bf16, lay)[2] == 2_105_344 + 8_192_004
    assert rank_floor(WIDE_VOCAB, 256, 1, amp, lay) <= mem.peak


@pytest.mark.slow
def test_torchtitans_70b_layout_fits_on_256_gpus():
    """Issue 27's check: torchtitan's Llama-3.1-70B setup (FSDP2 32 × TP 8 + SP + loss parallel, full
    checkpointing, 8k) is in ``plan llama-3.1-70b --gpus 256`` as fitting, with its exact peak equal to the
    replay's; its floor had been above the GPU (the full-vocabulary fp32 loss counted under vocab parallel)."""
    from lm_accounting.analytic.parallel import rank_floor, rank_step
    from lm_accounting.config import load_config
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.setup import TrainingSetup

    cfg = load_config("llama-3.1-70b")
    result = plan(cfg, "h100-80gb", (256, 256), 8192, 4 * 1024 * 1024, 15 * 10**12, top=10**6)
    lay = ParallelLayout(dp=32, zero=3, tp=8, sequence_parallel=True, vocab_parallel=True)
    ours = [c for c in result.ranked if c.layout == lay and c.checkpoint == "full"]
    assert ours and all(c.peak_exact for c in ours)
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")
    for c in ours:
        peak = rank_step(cfg, 8192, c.micro_batch, setup, lay, mode="plain")[0].peak
        assert c.per_gpu == peak + result.allowance <= gpu("h100-80gb").cuda_total
        assert rank_floor(cfg, 8192, c.micro_batch, setup, lay) <= peak


def test_llama_405b_on_16k_gpus_considers_16_pipeline_stages():
    """Issue 27's check: Llama 3 405B was trained with TP 8 and PP 16; ``plan llama-3.1-405b --gpus 16384
    --global-batch-tokens 16777216`` considers such a layout (126 layers over 16 uneven stages) and gives its
    peak, the worst stage's (``plan.MAX_PP`` was 8), with and without interleaving: 16 · v stages of 126 layers
    are uneven for every v > 1, and ``plan`` tries v = 2 and 4 (32 and 64 stages; 8 would be 128 > 126)."""
    from lm_accounting.config import load_config

    cfg = load_config("llama-3.1-405b")
    result = plan(cfg, "h100-80gb", (16384, 16384), 8192, 16 * 1024 * 1024, 156 * 10**11, top=10**6)
    deep = [c for c in result.ranked if c.layout.tp == 8 and c.layout.pp == 16]
    assert deep and all(c.per_gpu <= gpu("h100-80gb").cuda_total for c in deep) and {c.layout.dp for c in deep} == {128}
    assert {c.layout.virtual_stages for c in deep} == {1, 2, 4}
    # beside FSDP2 the stage (1F1B) or the rank's chunks (interleaved, along the runtime's UNSHARD and RESHARD
    # actions) are replayed, exact; beside DDP/ZeRO-1 × TP an estimate (limits.md)
    one = [c for c in deep if c.layout.virtual_stages == 1]
    assert all(c.peak_exact == (c.layout.zero >= 2) for c in one) and any(c.peak_exact for c in one)
    assert all(c.peak_exact == (c.layout.zero >= 2) for c in deep if c.layout.virtual_stages > 1)


def test_your_own_layout_is_priced_alone_as_the_enumeration_prices_it(run_cli):
    """Issue 27: ``plan --dp/--zero/--tp/... --checkpoint`` prices exactly that layout.  Each micro-batch it
    leaves open is a row equal to the same candidate's row of the whole enumeration over 256 GPUs (the same
    rules: no separate path), and its per-GPU figure is the replay's worst-rank peak + the allowance."""
    import json

    from lm_accounting.analytic.parallel import rank_step
    from lm_accounting.config import load_config
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.plan import OwnLayout
    from lm_accounting.setup import TrainingSetup

    cfg = load_config("llama-3.1-70b")
    lay = ParallelLayout(dp=32, zero=3, tp=8, sequence_parallel=True, vocab_parallel=True)
    own = plan(cfg, "h100-80gb", (8, 1024), 8192, 4 * 1024 * 1024, 15 * 10**12, own=OwnLayout(lay, "full"))
    assert [c.micro_batch for c in own.ranked] == [16, 8, 4, 2, 1]  # 512 sequences over dp 32: 16 a rank
    assert own.complete and own.own == "dp32·zero3·tp8+sp+vp (checkpoint full)"
    whole = plan(cfg, "h100-80gb", (256, 256), 8192, 4 * 1024 * 1024, 15 * 10**12, top=10**6)
    rows = {(c.layout.label, c.checkpoint, c.micro_batch): c for c in whole.ranked}
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")
    for c in own.ranked:
        assert c == rows[(lay.label, "full", c.micro_batch)]
        assert c.per_gpu == rank_step(cfg, 8192, c.micro_batch, setup, lay, mode="plain")[0].peak + own.allowance
    args = ["plan", "llama-3.1-70b", "--tokens", "15e12", "-S", "8192", "--dp", "32", "--zero", "3", "--tp", "8"]
    r = run_cli(*args, "--sp", "--vocab-parallel", "--checkpoint", "full", "--micro-batch", "4", "--format", "json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert [row["micro_batch"] for row in out["best"]] == [4] and out["own_layout"].startswith("dp32·zero3·tp8")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--dp", "3"], "does not split a step's 512 sequences"),
        (["--dp", "32", "--micro-batch", "3"], "a micro-batch must divide them"),
        (["--dp", "2", "--tp", "16"], "tp=16 does not divide the kv heads"),
        (["--set", "num_kv_heads=16", "--dp", "2", "--tp", "16"], "spans nodes"),
        (["--dp", "32", "--rank", "1"], "--rank is memory's"),
        (["--dp", "32", "--pp", "2", "--micro-batches", "4"], "pin the sequences per micro-batch"),
        (["--checkpoint", "full"], "give it with --dp"),
        (["--dp", "2", "--zero", "0", "--checkpoint", "none", "--micro-batch", "256"], "does not fit the layout"),
        (["--dp", "8", "--ep", "2", "--zero", "3"], "expert parallel needs a mixture of experts"),
        (["--dp", "32", "--tp", "2", "--checkpoint", "op"], "is modelled under data parallel alone"),
    ],
)
def test_your_own_layout_refusals_are_one_line(run_cli, flags, words):
    r = run_cli("plan", "llama-3.1-70b", "--tokens", "15e12", "-S", "8192", *flags)
    assert r.code == 2 and words in r.err and "\n" not in r.err.strip(), r.err


@pytest.mark.parametrize(
    "name, gpus, gpu_name, seq, batch_tokens",
    [
        ("llama-3-8b", (8, 16), "h100-80gb", 8192, 4 * 1024 * 1024),  # 4,599 candidates, 844 fit
        pytest.param(
            "llama-3.1-70b", (32, 64), "a100-40gb", 8192, 4 * 1024 * 1024, marks=pytest.mark.slow
        ),  # 7,236; 18
        pytest.param("llama-3.1-70b", (8, 1024), "h100-80gb", 8192, 4 * 1024 * 1024, marks=pytest.mark.slow),  # 22,059
        # context parallel enumerated (16k positions): 1,393 candidates, 402 fit, 58 of them CP when written
        pytest.param("llama-3-8b", (8, 8), "h100-80gb", 16384, 8 * 16384, marks=pytest.mark.slow),
    ],
)
def test_pruning_finds_what_the_brute_force_finds(name, gpus, gpu_name, seq, batch_tokens):
    """Issue 27: with pruning off every candidate is replayed (no floor, no micro-batch chain skipped); the
    pruned search finds the same fitting layouts, in the same order, with the same figures."""
    from lm_accounting.analytic.sizes import at_context
    from lm_accounting.config import load_config

    cfg = at_context(load_config(name), seq)
    args = (cfg, gpu_name, gpus, seq, batch_tokens, 15 * 10**12)
    pruned, brute = plan(*args, top=10**6), plan(*args, top=10**6, prune=False)
    assert brute.checked == brute.evaluated == pruned.evaluated and brute.complete
    assert pruned.ranked == brute.ranked and len(brute.ranked) > 10
    assert (seq >= 16384) == (sum(c.layout.cp > 1 for c in brute.ranked) > 20)
    # the fastest at each GPU count from the cheapest's up: the first of that count in the complete ranking (at
    # one count GPU-hours order is step order); a smaller count is dominated by the cheapest (more days, at least
    # its GPU-hours), so its absence loses no frontier point
    cheapest, first = brute.ranked[0], {}
    for c in brute.ranked:
        first.setdefault(c.layout.world, c)
        if c.layout.world < cheapest.layout.world:
            assert c.step_s > cheapest.step_s and c.step_s * c.layout.world >= cheapest.step_s * cheapest.layout.world
    expected = tuple(first[w] for w in sorted(first) if w >= cheapest.layout.world)
    assert pruned.fastest == brute.fastest == expected


def test_plan_prints_mfu_and_hfu_from_its_own_step():
    """Issue 28: every row's MFU is model FLOPs (3 × forward, by hand below) over step × GPUs × bf16 peak; HFU
    is the busiest GPU's hardware FLOPs over step × peak."""
    from lm_accounting.analytic.flops import forward_flops
    from lm_accounting.config import load_config

    cfg = load_config("llama-3-8b")
    result = plan(cfg, "h100-80gb", (8, 8), 8192, 4 * 1024 * 1024, 15 * 10**12, top=50)
    model = 3 * forward_flops(cfg, 8192).total * 512  # 4,194,304 tokens = 512 sequences of 8,192
    peak = 989.4e12  # H100 SXM bf16 dense (gpus.py)
    for c in result.ranked:
        row = result.row(c)
        assert row["model_flops_per_step"] == model
        assert row["mfu"] == pytest.approx(model / (c.step_s * 8 * peak), rel=1e-12)
        assert row["hfu"] == pytest.approx(row["hardware_flops_per_step"] / (c.step_s * peak), rel=1e-12)
        assert 0 < row["mfu"] <= row["hfu"] < 1
        if c.checkpoint == "full":
            assert row["mfu"] < row["hfu"]  # recompute runs FLOPs the model does not count


def test_the_frontier_of_days_against_gpu_hours_by_hand():
    """``plan.frontier``: (step s, GPUs) → GPU-seconds a step: A (10 s, 8) 80; B (5 s, 16) 80; C (4 s, 32) 128;
    D (4 s, 64) 256; E (3 s, 64) 192.  B takes fewer days than A for the same GPU-hours: A is off; C is on (fastest
    at 128); D is off (C as fast for less); E is on (fastest).  Equal within rounding counts as equal (dp 32 and
    dp 256 of one layout: 1e-12 apart)."""
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.plan import Candidate, frontier

    def cand(step, world):
        return Candidate(ParallelLayout(dp=world), "full", 1, 1, 0, step, 0.0, 0.0, 0.0, 0.0, True)

    points = [cand(10, 8), cand(5, 16), cand(4, 32), cand(4, 64), cand(3, 64)]
    assert frontier(tuple(points)) == [False, True, True, False, True]
    twins = (cand(2.0, 8), cand(2.0 * (1 + 1e-12), 8))
    assert frontier(twins) == [True, True]


def test_plan_json_lists_the_fastest_layout_at_each_gpu_count(run_cli):
    """``fastest_per_gpu_count``: one row per GPU count from the cheapest's up, each with ``frontier``; the first is
    the best row of ``best`` (the cheapest is the fastest at its own count)."""
    import json

    r = run_cli("plan", "llama-3-8b", "--gpus", "8..64", "--tokens", "1e12", "--context", "8192", "--format", "json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    rows = d["fastest_per_gpu_count"]
    assert rows[0] == {**d["best"][0], "frontier": True}
    assert [x["gpus"] for x in rows] == sorted({x["gpus"] for x in rows}) and rows[-1]["gpus"] <= 64
    assert all(isinstance(x["frontier"], bool) for x in rows)
