"""Issue 27: context parallel in ``plan``'s search, and ``train-time --cp`` at ``plan``'s price of the same job."""

from __future__ import annotations

import dataclasses
import json

import pytest

import lm_accounting.plan as pl
from lm_accounting.analytic.sizes import at_context
from lm_accounting.config import ModelConfig, load_config
from lm_accounting.parallelisms.cp import BESIDE

SMALL = ModelConfig(vocab_size=64, context_length=32, num_layers=4, d_model=16, num_heads=2, d_ff=32, name="small4")


def cp_families(cfg, seq, gpus, sequences) -> list[dict]:
    return [f for f in pl._families(cfg, seq, gpus, sequences) if f["cp"] > 1]


def test_the_search_enumerates_the_cp_degrees_context_parallel_takes():
    """At 32,768 positions (128 sequences a step) over 8..64 GPUs: every power of two 2 <= cp <= 16 dividing W / tp,
    dp = W / (tp·cp), with each ZeRO stage (over dp·cp > 1 ranks), under FSDP2 HSDP's replicate r = dp / dp_shard for
    dp_shard 1, 2, 4, 8 with dp_shard·tp <= 8 and r >= 2 (torchtitan's dp_replicate × dp_shard × cp), and nothing CP
    refuses beside it (``parallelisms.cp.BESIDE``); none at the 8,192 default (MIN_CP_CONTEXT), none for a mixture of
    experts, and at S = 16,392 = 8 · 2,049 only cp 2 and 4 (S a multiple of 2·cp: 16,392 / 16 is not whole)."""
    cfg = at_context(load_config("llama-3.1-70b"), 32768)
    found = cp_families(cfg, 32768, (8, 64), 128)
    assert all(f[field] in (False, 1) for f in found for field, _ in BESIDE)  # what CP refuses beside it
    assert all(f["virtual_stages"] == 1 for f in found)
    by_hand = {
        (w, tp, cp, zero, r)
        for w in (8, 16, 32, 64)
        for tp in (1, 2, 4, 8)  # the 64 heads, 8 kv heads and d_ff 28,672 divide by each
        for cp in (2, 4, 8, 16)
        if w % (tp * cp) == 0
        for dp in (w // (tp * cp),)
        for zero in (0, 1, 2, 3)
        for r in [1] + [dp // s for s in (1, 2, 4, 8) if zero >= 2 and s * tp <= 8 and dp % s == 0 and dp // s >= 2]
    }
    got = {(f["dp"] * f["tp"] * f["cp"], f["tp"], f["cp"], f["zero"], f["replicate"]) for f in found}
    assert got == by_hand
    plain = [f for f in found if not (f["sequence_parallel"] or f["vocab_parallel"])]  # SP/VP where CP takes them
    assert len([f for f in plain if f["replicate"] == 1]) == 4 * (6 + 10 + 13 + 15)  # (W, tp, cp): 6, 10, 13, 15
    # HSDP beside CP, written out for W = 16, tp 8, cp 2 (dp 1: none) and W = 16, tp 1, cp 2 (dp 8: dp_shard 1, 2,
    # 4, so r = 8, 4, 2; dp_shard 8 leaves one replica)
    assert {f["replicate"] for f in plain if (f["dp"], f["tp"], f["cp"], f["zero"]) == (1, 8, 2, 3)} == {1}
    assert {f["replicate"] for f in plain if (f["dp"], f["tp"], f["cp"], f["zero"]) == (8, 1, 2, 3)} == {1, 2, 4, 8}
    assert cp_families(at_context(cfg, 8192), 8192, (8, 64), 512) == []
    assert cp_families(at_context(load_config("mixtral-8x7b"), 32768), 32768, (8, 64), 128) == []
    odd = cp_families(at_context(cfg, 16392), 16392, (8, 64), 128)
    assert {f["cp"] for f in odd} == {2, 4}


@pytest.mark.slow
def test_plan_says_what_context_parallel_it_searched(run_cli):
    args = ["plan", "llama-3-8b", "--tokens", "1e12", "--gpus", "8..16", "--format", "table"]
    long = run_cli(*args, "-S", "32768")
    assert long.code == 0, long.err
    assert "Context parallel searched: cp 2..16" in long.out and all(what in long.out for _, what in BESIDE)
    assert "·cp" in long.out  # at 32k a CP layout ranks among the best ten
    short = run_cli(*args, "-S", "8192")
    assert short.code == 0 and "Context parallel searched: none (searched from 16,384 positions" in short.out


@pytest.mark.slow
def test_pruning_with_context_parallel_finds_what_the_brute_force_finds(monkeypatch):
    """Issue 27 under CP (enumerated here at a 32-position context, cp 2 and 4: each CP replay is one per cp rank):
    with pruning off every candidate is replayed (no floor, no micro-batch chain skipped); the pruned search finds the
    same fitting layouts, CP ones among them, in the same order, with the same figures, and its first five are the
    brute force's.  The allowance leaves 250 kB of the GPU: most candidates do not fit."""
    monkeypatch.setattr(pl, "MIN_CP_CONTEXT", 32)
    monkeypatch.setattr(pl, "MAX_CP", 4)
    allowance = 84_943_715_696 - 250_000  # the H100's CUDA total less 250 kB
    args = (SMALL, "h100-80gb", (8, 16), 32, 1024, 1024 * 10)
    brute = pl.plan(*args, top=10**6, allowance=allowance, prune=False)
    assert brute.checked == brute.evaluated and brute.complete
    cps = [c for c in brute.ranked if c.layout.cp > 1]
    assert cps and len(cps) < len(brute.ranked) < brute.evaluated and len(brute.ranked) > 10
    for top in (10**6, 5):
        pruned = pl.plan(*args, top=top, allowance=allowance)
        assert pruned.evaluated == brute.evaluated and pruned.ranked == brute.ranked[:top]
        assert pruned.fastest == brute.fastest


@pytest.mark.parametrize(
    "layout, checkpoint",
    [
        (["--dp", "4", "--zero", "3", "--cp", "2"], "full"),
        (["--dp", "2", "--zero", "2", "--tp", "2", "--cp", "4"], "none"),
        (["--dp", "8", "--zero", "1", "--tp", "2", "--sp"], "full"),  # without CP too
    ],
)
def test_train_time_prices_a_layout_as_plan_does(run_cli, layout, checkpoint):
    """Issue 27: ``plan`` and ``train-time`` take the same layout flags and price exactly that layout: the same step,
    MFU and HFU.  Two micro-batches of one sequence per data-parallel rank (plan: --micro-batch 1 and a global
    batch of 2·dp sequences); train-time's step FLOPs are 3 × the forward's over those 2·dp sequences."""
    from lm_accounting.analytic.training import step_flops

    dp, seq = int(layout[1]), 16384
    common = ["llama-3-8b", "-S", str(seq), "--checkpoint", checkpoint, *layout, "--format", "json"]
    p = run_cli("plan", *common, "--micro-batch", "1", "--global-batch-tokens", str(2 * dp * seq), "--tokens", "1e9")
    assert p.code == 0, p.err
    best = json.loads(p.out)["best"]
    assert [(row["micro_batch"], row["accumulation"]) for row in best] == [(1, 2)]
    sdpa = () if "--cp" in layout else ("--attention", "sdpa")  # plan's; train-time's default is naive but under CP
    t = run_cli("train-time", *common, *sdpa, "--micro-batches", "2", "--gpu", "h100-80gb", "--precision", "amp-bf16")
    assert t.code == 0, t.err
    timed = json.loads(t.out)
    for key in ("step_seconds", "mfu", "hfu", "model_flops_per_step", "hardware_flops_per_step"):
        assert timed[key] == best[0][key], key
    assert timed["global_batch"] == 2 * dp and timed["layout"]["world"] == best[0]["gpus"]
    cfg = at_context(load_config("llama-3-8b"), seq)
    assert (
        timed["methods"]["3x"]["flops_per_step"] == step_flops(cfg, seq, 2 * dp, "3x") == timed["model_flops_per_step"]
    )
    assert ("--cp" in layout) == ("attention sdpa" in t.err)  # train-time's default attention is naive: CP says so


def test_cp_without_attention_runs_sdpa_and_says_so(run_cli):
    """Issue 27 usability: --cp > 1 without --attention runs sdpa (the only attention CP runs), said on stderr and in
    the header; an explicit --attention naive is refused in one line."""
    args = ["llama-3-8b", "-S", "16384", "--dp", "2", "--zero", "3", "--cp", "2", "--precision", "amp-bf16"]
    for command in ("memory", "train-time"):
        r = run_cli(command, *args)
        assert r.code == 0, r.err
        assert "attention sdpa: the only attention context parallel runs" in r.err
        assert "sdpa+none+amp-bf16" in r.out and "ring attention, sdpa its only attention" in r.out
        bad = run_cli(command, *args, "--attention", "naive")
        assert bad.code == 2 and "use --attention sdpa" in bad.err and "\n" not in bad.err.strip(), bad.err
    quiet = run_cli("memory", *args, "--attention", "sdpa")
    assert quiet.code == 0 and "the only attention" not in quiet.err


def test_train_time_layout_refusals_are_one_line(run_cli):
    base = ["train-time", "llama-3-8b", "-S", "16384"]
    for flags, words in [
        (["--dp", "2", "--rank", "1"], "--rank is memory's"),
        (["--dp", "2", "--cp", "2", "--pp", "2"], "beside pipeline parallel"),
        (["--dp", "2", "--cp", "2", "--checkpoint", "selective"], "selective checkpointing"),
        (["--tp", "3"], "tp=3"),
    ]:
        r = run_cli(*base, *flags)
        assert r.code == 2 and words in r.err and "\n" not in r.err.strip(), (flags, r.err)


@pytest.mark.slow
def test_the_search_at_32k_puts_cp_among_the_best_and_prices_it_as_its_own_layout():
    """At 32,768 positions the search ranks CP layouts (Llama-3-8B on 8..16 H100s), each priced as ``plan --cp``
    prices that layout alone (``OwnLayout``: the same row)."""
    cfg = at_context(load_config("llama-3-8b"), 32768)
    whole = pl.plan(cfg, "h100-80gb", (8, 16), 32768, 4 * 1024 * 1024, 10**12, top=20)
    cps = [c for c in whole.ranked if c.layout.cp > 1]
    assert cps
    c = cps[0]
    own = pl.plan(cfg, "h100-80gb", (8, 16), 32768, 4 * 1024 * 1024, 10**12,
                  own=pl.OwnLayout(dataclasses.replace(c.layout, micro_batches=1), c.checkpoint, c.micro_batch))  # fmt: skip
    assert own.ranked == (c,)
