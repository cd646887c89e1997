"""``plan``'s work, bounded by counts (issues 27 and 28; the seconds are ``benchmarks/bench_plan.py``'s and
``bench_cli.py``'s): the communication priced lazily in GPU-hours order gives the order of the full sort, while
pricing a fraction of the candidates; and the caches the planner leans on return what an uncached call does."""

import dataclasses
import pickle

import pytest

import lm_accounting.plan as pl
from lm_accounting.analytic.pipeline import (
    _flat,
    _interleaved_first_backward,
    _interleaved_kept,
    _like,
    _stage_saved,
    _states,
    _sum_states,
    interleaved_dp_rank,
    schedule_buffers,
    stage_baseline,
)
from lm_accounting.config import AccountingError, load_config, preset_names
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup


def _lazy_and_eager(monkeypatch, cfg, gpus, top):
    """Run ``plan`` and record what its ranking's ``_by_gpu_hours`` yielded and how many candidates' communication
    it priced (the frontier's searches, after it, price more);
    return those beside the full sort of every candidate by (GPU-hours, step, index) with every step priced whole
    (``_Pricing.step_times``, the rule ``estimate_step`` and ``price_layout`` use)."""
    seen, lazy = {}, pl._by_gpu_hours

    def recording(pending, pricing):
        if "pending" in seen:  # the frontier's searches, one GPU count each, after the ranking's
            yield from lazy(pending, pricing)
            return
        seen["pending"], seen["pricing"], seen["yielded"] = list(pending), pricing, []
        communication = pricing.communication
        calls = []

        def counted(*args):
            calls.append(args)
            return communication(*args)

        pricing.communication = counted
        seen["calls"] = calls
        try:
            for item in lazy(pending, pricing):
                seen["yielded"].append(item)
                yield item
        finally:  # the ranking is read: the frontier's searches price on
            seen["priced"] = len(calls)

    monkeypatch.setattr(pl, "_by_gpu_hours", recording)
    pl.plan(cfg, "h100-80gb", gpus, 8192, 4 * 1024 * 1024, 15 * 10**12, top=top)
    fresh = pl._Pricing(cfg, 8192, seen["pricing"].g, 1.0, pl.DEFAULT_INTERNODE)
    eager = []
    for _, i, b, setup, lay, _ in seen["pending"]:
        times = fresh.step_times(b, setup, lay)
        step = pl.step_seconds(*times)
        eager.append((step * lay.world, step, i, b, setup, lay, times))
    eager.sort(key=lambda c: c[:3])
    return seen["yielded"], eager, seen["priced"], len(seen["pending"])


@pytest.mark.slow
def test_every_candidate_in_the_order_of_the_full_sort(monkeypatch):
    """``--top`` past the candidates' number: every one is yielded, in the full sort's order, each with the
    step times the eager rule gives (the same floats: compute, then steps 2-4)."""
    cfg = load_config("llama-3-8b").with_context(8192)
    yielded, eager, priced, candidates = _lazy_and_eager(monkeypatch, cfg, (8, 64), 10**6)
    assert candidates > 1000 and priced == candidates
    assert yielded == eager


@pytest.mark.slow
def test_the_70b_plan_prices_the_communication_of_a_fraction(monkeypatch):
    """Llama-3.1-70B over 8..1024 GPUs (the bench's plan-70b): the first candidates yielded are the full sort's
    first, and the communication (steps 2-4) is priced for under a third of the 61,935 candidates (11,499 of
    50,976 when written: those whose compute · GPUs is below the GPU-hours of the last one checked), and under
    100 of the candidates checked are replayed.  Uneven interleaved stages add 8,121 to the 50,976 (pp 8 × v 4,
    pp 16 × v 2 and 4: 32 and 64 stages of 80 layers), and HSDP 2,838: 512 sequences a step, pp 1, zero 2 or 3, 3 checkpointings, b a power of
    two dividing 512/dp (log2(512/dp) + 1 sizes), shard s with s·tp <= 8 and dp/s >= 2: tp 1 (dp = W of 8..512,
    s of 2, 4, 8): 2·(2·7 + 3·(6+5+4+3+2+1))·3 = 462; tp 2 (dp 4..512, s of 2, 4; ×4 for sp and vp):
    2·(8 + 2·(7+6+5+4+3+2+1))·4·3 = 1,536; tp 4 (dp 4..256, s 2): 2·(8+7+6+5+4+3+2)·4·3 = 840.  torchtitan's
    per-op checkpointing adds 112 (data parallel alone: tp = pp = 1, dp = W of 8..512, zero 0-3, b as above):
    4·(7+6+5+4+3+2+1) = 112."""
    cfg = load_config("llama-3.1-70b").with_context(8192)
    peak, replays = pl._peak, []
    monkeypatch.setattr(pl, "_peak", lambda *args, **kw: replays.append(args) or peak(*args, **kw))
    yielded, eager, priced, candidates = _lazy_and_eager(monkeypatch, cfg, (8, 1024), 10)
    assert candidates == 50_976 + 8_121 + 462 + 1_536 + 840 + 112
    assert yielded == eager[: len(yielded)] and len(yielded) > 1000
    assert priced < candidates // 3
    # 817 when written, 1,022 once sequence parallel's norms run at S/tp (step_time 6: SP layouts rank higher, so more
    # are checked before ten fit); the floors skip the rest of those checked.  28 once an interleaved rank's floor
    # counts the saved activations in flight at its first backward: the 994 interleaved ones replayed were all above
    # the GPU, now each its floor's
    assert 0 < len(replays) < 100


def test_the_70b_plan_records_thirteen_programs_and_prices_each_kernel_shape_once(monkeypatch):
    """Issue 28: the time model's work in the bench's plan-70b, bounded by counts (not seconds).  Llama-3.1-70B's
    tp degrees are the four of {1, 2, 4, 8} dividing its 64 heads, 8 kv heads and 28,672 d_ff, beside three
    checkpointings (none, full, selective): 4 · 3 = 12 programs, and torchtitan's per-op checkpointing under data
    parallel alone (tp 1): 13 recorded, each once.  Each GEMM and attention call is
    priced once per shape (``Program.at``'s memo: the shapes recur across checkpointings, micro-batches and sequence
    parallel; 3,468 GEMM pricings when each (program, b, SP) priced its own).  One micro-batch's seconds are priced
    once per (b, checkpointing, tp, vp, pp, ep, v, SP) of the candidates, plus once per estimate (32,652 when every
    (k, shard) priced its own), and the DDP collectives read no model states (ZeRO-1's owner search)."""
    from lm_accounting.analytic import collectives, step_time
    from lm_accounting.analytic.ops import tensors

    cfg = load_config("llama-3.1-70b").with_context(8192)
    step_time.program.cache_clear()  # recorded afresh, as in a new process
    recorded, gemms, attentions, ddp_states, micro, estimates, pending = [], [], [], [], [], [], []
    recording_work, batched, attention, states = (
        tensors.recording_work, step_time.batched_seconds, step_time.attention_seconds, collectives.model_states
    )  # fmt: skip
    micro_batch, estimate, lazy = pl._Pricing.micro_batch, pl._Pricing.estimate, pl._by_gpu_hours

    def ranking(candidates, pricing):
        pending.extend(candidates)
        yield from lazy(candidates, pricing)

    monkeypatch.setattr(tensors, "recording_work", lambda *a, **k: recorded.append(1) or recording_work(*a, **k))
    monkeypatch.setattr(step_time, "batched_seconds", lambda *a: gemms.append(a[1:]) or batched(*a))
    monkeypatch.setattr(step_time, "attention_seconds", lambda *a: attentions.append(a[1:]) or attention(*a))
    monkeypatch.setattr(collectives, "model_states", lambda *a, **k: ddp_states.append(a[2]) or states(*a, **k))
    monkeypatch.setattr(pl._Pricing, "micro_batch", lambda self, *a: micro.append(a) or micro_batch(self, *a))
    monkeypatch.setattr(pl._Pricing, "estimate", lambda self, *a: estimates.append(a) or estimate(self, *a))
    monkeypatch.setattr(pl, "_by_gpu_hours", ranking)
    pl.plan(cfg, "h100-80gb", (8, 1024), 8192, 4 * 1024 * 1024, 15 * 10**12, top=10)
    assert len(recorded) == 4 * 3 + 1
    assert gemms and len(gemms) == len(set(gemms))
    assert attentions and len(attentions) == len(set(attentions))
    assert ddp_states and all(lay.fsdp for lay in ddp_states)  # FSDP2's gathers read the padded states
    kinds = {
        (b, s.checkpoint, lay.tp, lay.vocab_parallel, lay.pp, lay.ep, lay.virtual_stages, lay.sequence_parallel)
        for _, _, b, s, lay, _ in pending
    }
    assert len(micro) <= len(kinds) + len(estimates) < len(pending) // 10  # 4,135 of 61,935 when written


def test_interleaved_kept_bytes_are_each_chunks_rule():
    """The kept bytes of an interleaved pipeline rank (cached once for every m and B) are the sum of its
    chunks' ``stage_baseline`` with the step's ids or targets at the job's m, and ``schedule_buffers`` scaled
    from the chunks' S micro-batches to m, as each chunk's rule states them, at several m and B."""
    cfg = load_config("llama-3-8b").with_context(8192)
    setup = TrainingSetup(precision="amp-bf16")
    for zero, m, b in [(0, 8, 1), (1, 8, 2), (1, 16, 4), (3, 12, 1), (2, 24, 2)]:
        lay = ParallelLayout(dp=4, zero=zero, tp=2, pp=4, virtual_stages=2, micro_batches=m)
        chunks_lay, S = lay.as_chunks(), lay.stages
        for rank in range(lay.pp):
            dp_rank = interleaved_dp_rank(cfg, setup, lay, rank)
            models = [_like(cfg.num_layers, S, c) for c in lay.chunks(rank)]
            st = _sum_states([_states(cfg, setup, chunks_lay, c, dp_rank) for c in models])
            ids = [((c == 0) + (c == S - 1)) * 8 * (m - S) * b * 8192 for c in models]  # ids or targets at m, not S
            base = sum(
                stage_baseline(cfg, 8192, b, setup, chunks_lay, c, dp_rank) + x
                for c, x in zip(models, ids, strict=True)
            )
            buffers = sum(schedule_buffers(cfg, 8192, b, setup, chunks_lay, c) for c in models) // S * m
            assert _interleaved_kept(cfg, 8192, b, setup, lay, rank, None) == (st, base, buffers)
            # each chunk's saved activations (one cached look-up per rank, for every m) are its stage's rule
            saved = [_stage_saved.__wrapped__(cfg, 8192, b, setup, _flat(lay), S, c) for c in lay.chunks(rank)]
            assert list(_interleaved_first_backward(cfg, 8192, b, setup, lay, rank, None)[3]) == saved


def test_a_config_hashes_as_its_fields_and_pickles_without_its_hash():
    """The config's hash is computed once (the analytic caches hash it at every look-up): equal configs
    hash alike, a changed field changes it, and a pickle (another process: another string hash) leaves it
    out; ``with_layers`` is ``dataclasses.replace`` of the block count, one object per count."""
    cfg = load_config("llama-3.1-70b")
    assert hash(cfg) == hash(load_config("llama-3.1-70b")) and {cfg: 1}[load_config("llama-3.1-70b")] == 1
    assert hash(cfg) != hash(dataclasses.replace(cfg, d_ff=cfg.d_ff + 1))
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and "_hash" not in back.__dict__ and hash(back) == hash(cfg)
    two = cfg.with_layers(2)
    assert two == dataclasses.replace(cfg, num_layers=2) and two is cfg.with_layers(2)


def test_every_cached_price_reads_the_fields_it_is_keyed_on():
    """Issue 27: ``plan``'s pricing caches each part on the fields it reads.  Perturb every layout field (and the
    micro-batch and checkpointing) of a base layout, one at a time: a pricing warmed on the base and its neighbours
    gives each neighbour the step times and estimate a fresh pricing gives it, so no cached part was keyed without
    a field it reads.  Every field moves the price of at least one neighbour (none is read by nothing)."""
    cfg = load_config("llama-3-8b").with_context(8192)
    h100 = pl.gpu("h100-80gb")
    base = dict(dp=4, zero=3, tp=2, sequence_parallel=True, vocab_parallel=True, pp=2, micro_batches=4)
    moves = {
        "dp": dict(dp=8),
        "zero": dict(zero=2),
        "tp": dict(tp=4),
        "sequence_parallel": dict(sequence_parallel=False),
        "vocab_parallel": dict(vocab_parallel=False),
        "pp": dict(pp=4),
        "micro_batches": dict(micro_batches=8),
        "virtual_stages": dict(virtual_stages=2),
        "replicate": dict(pp=1, replicate=2),  # HSDP is planned without pp: the same layout with pp 1 is its pair
    }
    setups = {ck: TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint=ck) for ck in ("full", "none")}
    cases = [(1, "full", ParallelLayout(**base))]
    cases += [(1, "full", ParallelLayout(**{**base, **m})) for m in moves.values()]
    cases += [(1, "full", ParallelLayout(**{**base, "pp": 1})), (2, "full", ParallelLayout(**base))]
    cases += [(1, "none", ParallelLayout(**base)), (1, "full", ParallelLayout(**{**base, "zero": 1}))]  # FSDP2 or not
    warm = pl._Pricing(cfg, 8192, h100, 1.0, pl.DEFAULT_INTERNODE)
    prices = {}
    for b, ck, lay in cases:
        times = warm.step_times(b, setups[ck], lay)
        fresh = pl._Pricing(cfg, 8192, h100, 1.0, pl.DEFAULT_INTERNODE)
        assert times == fresh.step_times(b, setups[ck], lay), (b, ck, lay.label)
        assert warm.estimate(b, setups[ck], lay, times) == fresh.estimate(b, setups[ck], lay, times)
        prices[b, ck, lay] = times
    first = prices[cases[0]]
    for (b, ck, lay), times in list(prices.items())[1:]:
        assert times != first, f"{lay.label} (b {b}, {ck}) prices as the base"


def _plannable() -> list[str]:
    """The presets ``plan`` takes (``_check_plannable``: the rest are refused in one line)."""
    out = []
    for name in preset_names():
        try:
            pl._check_plannable(load_config(name))
        except AccountingError:
            continue
        out.append(name)
    return out


PLANNABLE = _plannable()


def test_most_presets_are_plannable():
    """The linearity check below runs over the presets ``plan`` takes: dense and mixture-of-experts ones alike."""
    assert len(PLANNABLE) >= 10 and {"llama-3.1-70b", "gpt2-xl", "mixtral-8x7b", "qwen3-30b-a3b"} <= set(PLANNABLE)


@pytest.mark.parametrize("name", PLANNABLE)
def test_the_rank_flops_plan_shares_over_b_are_linear_in_b(name):
    """``_Pricing`` prices a micro-batch's compute from its rank's share of the TP-local model's FLOPs, taken at
    b = 1 but under expert parallel (declared independent of b: b·f / (b·w) is f / w, one real number, one float).
    That holds when ``rank_flops`` at b is b times its figure at 1, exactly, as integers: checked on every
    stage and rank the pricing reads, for the layouts ``plan`` enumerates (tp with vocab parallel, pp, interleaved
    stages, uneven splits; a mixture of experts without ep), each checkpointing, b up to 64."""
    cfg = load_config(name).with_context(1024)
    dense = not cfg.moe
    layouts = [ParallelLayout()]
    if dense:
        for tp in (2, 4):
            if cfg.num_heads % tp == 0 and cfg.kv_heads % tp == 0 and cfg.d_ff % tp == 0:
                layouts += [ParallelLayout(tp=tp, vocab_parallel=not cfg.tie_embeddings)]
        tp = max(layouts[-1].tp, 1)  # the widest TP the heads take, under pipeline parallel too
        for pp, v in ((2, 1), (4, 1), (3, 1), (2, 2), (4, 4), (8, 2)):
            if pp * v <= cfg.num_layers:
                vp = tp > 1 and not cfg.tie_embeddings
                layouts.append(ParallelLayout(tp=tp, vocab_parallel=vp, pp=pp, micro_batches=pp, virtual_stages=v))
    checked = 0
    for ck in ("none", "full", "selective"):
        setup = TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint=ck)
        for lay in layouts:
            stages = sorted({0, lay.pp - 1}) if lay.pp > 1 else [None]
            for s in stages:
                one = pl.rank_flops(cfg, 1024, 1, setup, lay, 0, s)
                for b in (2, 3, 8, 64):
                    at_b = pl.rank_flops(cfg, 1024, b, setup, lay, 0, s)
                    assert (at_b.forward, at_b.recompute, at_b.attention_recompute) == (
                        b * one.forward,
                        b * one.recompute,
                        b * one.attention_recompute,
                    ), (name, ck, lay.label, s, b)
                    assert at_b.hardware == b * one.hardware
                    checked += 1
    assert checked >= 3 * 4


def test_every_cached_price_of_a_mixture_of_experts_reads_its_fields():
    """The perturbation of ``test_every_cached_price_reads_the_fields_it_is_keyed_on`` on a mixture of experts
    under expert parallel and HSDP (the data-parallel groups' cache reads the micro-batch and the checkpointing
    there: the all-to-alls), and the FLOPs share that stays per b under expert parallel (its busiest rank's rows)."""
    cfg = load_config("qwen3-30b-a3b").with_context(4096)
    h100 = pl.gpu("h100-80gb")
    base = dict(dp=8, zero=3, ep=2, micro_batches=2)
    moves = [dict(dp=16), dict(zero=2), dict(ep=4), dict(micro_batches=4), dict(replicate=2), dict(ep=1)]
    setups = {ck: TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint=ck) for ck in ("full", "none")}
    cases = [(1, "full", ParallelLayout(**base))]
    cases += [(1, "full", ParallelLayout(**{**base, **m})) for m in moves]
    cases += [
        (2, "full", ParallelLayout(**base)),
        (4, "full", ParallelLayout(**base)),
        (1, "none", ParallelLayout(**base)),
    ]
    warm = pl._Pricing(cfg, 4096, h100, 1.0, pl.DEFAULT_INTERNODE)
    prices = []
    for b, ck, lay in cases:
        times = warm.step_times(b, setups[ck], lay)
        fresh = pl._Pricing(cfg, 4096, h100, 1.0, pl.DEFAULT_INTERNODE)
        assert times == fresh.step_times(b, setups[ck], lay), (b, ck, lay.label)
        assert warm.estimate(b, setups[ck], lay, times) == fresh.estimate(b, setups[ck], lay, times)
        prices.append(times)
    assert all(p != prices[0] for p in prices[1:])


def test_plan_runs_without_the_cycle_collector_and_restores_it(monkeypatch):
    """``plan`` turns Python's cyclic collector off while it works (its ~10^5 live objects are acyclic; each full
    pass walked them) and back on after, a refusal included; a caller that turned it off keeps it off."""
    import gc

    cfg = load_config("llama-3-8b").with_context(8192)
    seen, ranking = [], pl._by_gpu_hours

    def recording(pending, pricing):
        seen.append(gc.isenabled())
        yield from ranking(pending, pricing)

    monkeypatch.setattr(pl, "_by_gpu_hours", recording)
    assert gc.isenabled()
    pl.plan(cfg, "h100-80gb", (8, 8), 8192, 4 * 1024 * 1024, 15 * 10**12, top=1)
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(pl.AccountingError):
        pl.plan(cfg, "h100-80gb", (8, 8), 8192, 4 * 1024 * 1024, 15 * 10**12, top=0)
    assert gc.isenabled()
    gc.disable()
    try:
        pl.plan(cfg, "h100-80gb", (8, 8), 8192, 4 * 1024 * 1024, 15 * 10**12, top=1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_interleaved_floors_and_the_stopped_replay_are_lower_bounds_on_random_layouts():
    """Issue 27: ``plan`` replays an interleaved candidate only when its floor fits, and stops replaying its pipeline
    ranks at the first above the GPU.  On 300 random interleaved layouts (pp 2/4, v 2-4, even and uneven, DDP,
    ZeRO-1/2/3, HSDP, TP ± SP ± VP, every checkpointing and precision, m = pp·1..3) the floor, now the larger of the
    units unsharded and the saved activations in flight at the first backward (each forward's ``_stage_saved``),
    never exceeds the worst rank's replayed peak, and a replay (a floor) stopped above any bound returns a rank's
    peak (floor): above that bound, at most the worst (the floor).  The activations term binds (exceeds the units') on many of them."""
    import random

    from lm_accounting.analytic.pipeline import pipeline_stages, stage_floor
    from lm_accounting.config import ModelConfig

    rng = random.Random(28)
    models = [
        ModelConfig(vocab_size=32000, context_length=512, num_layers=8, d_model=64, num_heads=8, d_ff=128,
                    num_kv_heads=2, name="wide-vocab"),
        ModelConfig(vocab_size=2000, context_length=512, num_layers=12, d_model=128, num_heads=4, d_ff=256, name="b"),
    ]  # fmt: skip
    checked = binding = stopped = 0
    while checked < 300:
        cfg, tp, pp, v = rng.choice(models), rng.choice([1, 2, 4]), rng.choice([2, 4]), rng.choice([2, 3, 4])
        dp = rng.choice([1, 2, 4, 8])
        if pp * v > cfg.num_layers:
            continue  # a stage without a block: plan does not enumerate it
        zero = rng.choice([0, 1, 2, 3]) if dp > 1 else 0
        replicate = 2 if zero >= 2 and dp >= 4 and rng.random() < 0.3 else 1
        sp, vp = tp > 1 and rng.random() < 0.5, tp > 1 and rng.random() < 0.5
        seq, batch = rng.choice([128, 256]), rng.choice([1, 2])
        setup = TrainingSetup(
            attention="sdpa",
            checkpoint=rng.choice(["none", "full", "selective"]),
            precision=rng.choice(["fp32", "bf16", "amp-bf16"]),
        )
        try:
            lay = ParallelLayout(dp=dp, zero=zero, tp=tp, sequence_parallel=sp, vocab_parallel=vp, pp=pp,
                                 micro_batches=pp * rng.choice([1, 2, 3]), virtual_stages=v, replicate=replicate)  # fmt: skip
            peak = pipeline_stages(cfg, seq, batch, setup, lay, with_traced=False)[1].peak  # as plan._peak
            floor = stage_floor(cfg, seq, batch, setup, lay)
        except AccountingError:
            continue  # a layout the model or the replay refuses (e.g. heads not divisible, too few blocks)
        assert floor <= peak, (cfg.name, lay.label, setup, floor - peak)
        shard = lay.shard_group()
        units = [_interleaved_first_backward(cfg, seq, batch, setup, shard, r, None) for r in {0, pp - 1}]
        fsdp = shard.fsdp and shard.dp > 1
        binding += any(x[4] > (x[0].unsharded_all if fsdp else 0) for x in units)
        stop = rng.randrange(floor // 2, peak + 1)
        got = pipeline_stages(cfg, seq, batch, setup, lay, with_traced=False, stop_above=stop)[1].peak
        first = stage_floor(cfg, seq, batch, setup, lay, stop_above=stop // 2)  # the first rank's, where above
        assert first == floor or stop // 2 < first <= floor, (lay.label, setup, stop // 2, first, floor)
        assert got == peak or stop < got <= peak, (lay.label, setup, stop, got, peak)
        stopped += got != peak
        checked += 1
    assert binding > 100 and stopped > 10, (binding, stopped)
