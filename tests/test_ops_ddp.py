"""DDP over transformers' programs (``analytic.ops.ddp``): one rank of ``DistributedDataParallel`` around
transformers' own model, as the HF Trainer wraps it, replayed without torch, equals the job on torch's fake process
group measured by the rank tracker (``measure.hf.measure_hf_step(..., layout=...)``, ``measure.hf_parallel``), phase
by phase, byte for byte; its bucket all-reduces equal the collectives the job records, in the first step (one bucket
per dtype) and once the reducer has rebuilt its buckets (1 MiB, then 25 MiB, parameters in reverse order)."""

import dataclasses
import itertools

import pytest
from test_ops_fsdp import FAMILY, B, N, S, tiny

from lm_accounting.analytic.ops import predict_step
from lm_accounting.analytic.ops.ddp import Replicate, predict_rank
from lm_accounting.config import AccountingError, load_config
from lm_accounting.hf_config import config_from_hf
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

DDP4 = ParallelLayout(dp=4, zero=0)


def test_a_rank_holds_the_buckets_beside_the_single_gpu_step_by_hand():
    """World 4, fp32 (no torch): tiny("llama") has N = 10,896 parameter elements (tests/test_ops_fsdp.py's count).
    A DDP rank starts with every parameter (4·N), AdamW's two moments (8·N), the bucket buffers holding a copy of
    every gradient (4·N), the token ids and labels (2·B·S int64) and the two rotary buffers (2 · head_dim/2 fp32);
    backward ends with the gradients added (4·N); every phase is the single-GPU step's plus the 4·N of buckets.
    bf16: 2 bytes an element for all of them; amp-bf16: the parameters, moments and buckets stay fp32."""
    cfg = tiny("llama")
    for precision, e in (("fp32", 4), ("bf16", 2), ("amp-bf16", 4)):
        setup = TrainingSetup(precision=precision)
        rep = Replicate(DDP4)  # find_unused_parameters=False
        rank = predict_step(cfg, S, setup, impl="transformers", batch=B, layout=DDP4, replicate=rep).at(B)
        one = predict_step(cfg, S, setup, impl="transformers", batch=B).at(B)
        baseline = 4 * e * N + 2 * B * S * 8 + 2 * 2 * 4
        assert rank.baseline == baseline, precision
        assert rank.backward.end == baseline + e * N
        assert rank.optimizer_step.end == baseline
        for name in ("forward", "backward", "optimizer_step"):
            r, o = rank.phase(name), one.phase(name)
            assert (r.peak - o.peak, r.end - o.end) == (e * N, e * N), (precision, name)
    assert baseline == 174_608  # amp-bf16's, fp32's


def test_find_unused_parameters_adds_the_used_maps_by_hand():
    """The HF Trainer's default without checkpointing (``find_unused_parameters=True``): tiny("llama") has 39
    parameter tensors (embedding, head, 12 + 8 + 8 matrices, 9 norms: test_zero1_ranks_own_whole_tensors_by_hand),
    so the reducer's two int32 maps (``local_used_map_``, ``local_used_map_dev_``) add 2 · 4 · 39 = 312 bytes to
    every figure, and backward all-reduces the 156-byte map after the buckets.  With full checkpointing the
    Trainer turns it off: the figures are find_unused=False's."""
    cfg = tiny("llama")
    for precision in ("fp32", "bf16", "amp-bf16"):
        off = predict_step(cfg, S, TrainingSetup(precision=precision), impl="transformers", batch=B, layout=DDP4,
                           replicate=Replicate(DDP4)).at(B)  # fmt: skip
        rep = Replicate(DDP4, find_unused=True)
        on = predict_rank(cfg, S, TrainingSetup(precision=precision), DDP4, impl="transformers", batch=B, replicate=rep)
        default = predict_step(cfg, S, TrainingSetup(precision=precision), impl="transformers", batch=B, layout=DDP4)
        assert on.at(B) == default.at(B)
        assert on.at(B).baseline == off.baseline + 312
        for name in ("forward", "backward", "optimizer_step"):
            assert (on.at(B).phase(name).peak, on.at(B).phase(name).end) == (
                off.phase(name).peak + 312,
                off.phase(name).end + 312,
            )
        assert rep.all_reduces() == [{"bf16": 2}.get(precision, 4) * N, 156]
    full = TrainingSetup(checkpoint="full")
    rep = Replicate(DDP4)
    assert predict_step(cfg, S, full, impl="transformers", batch=B, layout=DDP4).at(B) == predict_rank(
        cfg, S, full, DDP4, impl="transformers", batch=B, replicate=rep
    ).at(B)


def test_the_first_steps_buckets_are_one_per_dtype_by_hand():
    """One bucket per dtype holding every gradient (``dist._DEFAULT_FIRST_BUCKET_BYTES`` applies from the
    second step on): 4·N bytes in fp32, 2·N in bf16; the rebuilt buckets of this 43 KB model are one too."""
    for precision, e in (("fp32", 4), ("bf16", 2)):
        rep = Replicate(DDP4)
        predict_rank(tiny("llama"), S, TrainingSetup(precision=precision), DDP4, impl="transformers", replicate=rep)
        assert rep.all_reduces() == rep.all_reduces(first_step=False) == [e * N]


@pytest.mark.parametrize(
    "layout, match",
    [
        (ParallelLayout(dp=2, zero=1, tp=2), "tensor parallel is run alone"),
        (ParallelLayout(dp=2, zero=0, pp=2, micro_batches=2), "data parallel only"),
        (ParallelLayout(dp=2, tp=2), "tensor parallel is run alone"),
    ],
    ids=["zero1-tp", "pp", "ddp-tp"],
)
def test_what_it_does_not_replay_is_refused(layout, match):
    with pytest.raises(ValueError, match=match):
        predict_step(tiny("llama"), S, TrainingSetup(), impl="transformers", layout=layout)


def test_ddp_over_transformers_on_a_cuda_target_is_refused():
    """The course program's DDP rank runs on a CUDA target (tests/test_ops_data_parallel.py); transformers' not yet."""
    with pytest.raises(ValueError, match="CUDA target is not replayed"):
        predict_step(tiny("llama"), S, TrainingSetup(), impl="transformers", layout=DDP4, mode="plain", device="cuda")


# -- against the fake process group ----------------------------------------------------------------------------

pytest.importorskip("transformers")
from test_ops_transformers_mamba2 import tiny as nemotron_h
from test_ops_transformers_moe import tiny as moe
from test_ops_transformers_zoo import tiny as zoo

from lm_accounting.measure.hf import measure_hf_step
from lm_accounting.measure.hf_parallel import measure_hf_rank

MODELS = {
    **{f: (lambda f=f: tiny(f)) for f in FAMILY},  # llama, qwen3 (q/k norms), gpt2 (tied, LayerNorm, biases)
    "gemma2": lambda: zoo("gemma2"),
    "gemma3_text": lambda: zoo("gemma3_text"),
    "qwen3_moe": lambda: moe("qwen3_moe"),
    "mixtral": lambda: moe("mixtral"),
    "nemotron_h": lambda: nemotron_h("M*-M"),
}
EXPERTS = {"qwen3_moe", "mixtral"}  # grouped_mm's FakeTensor kernel takes bf16 only: fp32 weights on cpu tensors
# On real cpu tensors the rank tracker sees what it sees on FakeTensors: the CPU's kernel facts, and not AdamW's
# step counters (``torch.tensor(0.0)`` in ``Adam._init_group`` allocates outside any dispatch mode), so the replay
# is the meta one (``device`` "meta") for both.


def check(name: str, setup: TrainingSetup, world: int, zero: int = 0, rank: int = 0, find_unused: bool = False) -> None:
    """Rank ``rank`` of DDP (``zero`` 0) or ZeRO-1 over ``world`` ranks: the replay equals the fake-PG job, its
    first step's bucket all-reduces (and with ``find_unused`` the used-parameter map's) equal the job's recorded
    all-reduces, and ZeRO-1's broadcasts after the step are one per parameter tensor.  ``find_unused``: on real
    CPU tensors (the reducer reads the map's values)."""
    cfg, layout = MODELS[name](), ParallelLayout(dp=world, zero=zero)
    fake = (name not in EXPERTS or setup.param_dtype == "bf16") and not find_unused
    rep = Replicate(layout, rank, find_unused)
    lines = predict_rank(cfg, S, setup, layout, impl="transformers", batch=B, replicate=rep)
    calls: list = []
    got = measure_hf_rank(cfg, S, B, setup, layout, rank=rank, fake=fake, collectives=calls, find_unused=find_unused)
    assert lines.at(B) == got, (name, setup.label, world, zero, rank)
    assert [b for kind, b, phase in calls if kind == "all_reduce" and phase == "backward"] == rep.all_reduces()
    after = sorted(b for kind, b, phase in calls if kind == "broadcast" and phase == "optimizer_step")
    assert after == (sorted(rep.param_bytes) if zero == 1 else [])
    assert {kind for kind, _, _ in calls} <= {"all_reduce", "broadcast"}  # broadcast: the buffers, per forward


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, setup, world",
    [
        ("llama", TrainingSetup(), 2),
        ("qwen3", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"), 4),
        ("gpt2", TrainingSetup(precision="bf16", checkpoint="full"), 2),
        ("gemma3_text", TrainingSetup(precision="amp-bf16"), 4),
        ("qwen3_moe", TrainingSetup(precision="bf16"), 2),
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v),
)
def test_ddp_rank_equals_transformers_on_the_fake_process_group(name, setup, world):
    check(name, setup, world)


def test_the_measurement_goes_through_measure_hf_step():
    """``measure_hf_step(..., layout=DDP)``: the command's path, FakeTensors on meta (find_unused_parameters
    False), real CPU tensors under the Trainer's default without checkpointing (True); on meta that is refused."""
    cfg, setup = tiny("llama"), TrainingSetup(precision="bf16")
    off = predict_step(cfg, S, setup, impl="transformers", batch=1, layout=DDP4, replicate=Replicate(DDP4)).at(1)
    assert measure_hf_step(cfg, S, 1, setup, device="meta", layout=DDP4, find_unused=False) == off
    on = predict_step(cfg, S, setup, impl="transformers", batch=1, layout=DDP4).at(1)
    assert measure_hf_step(cfg, S, 1, setup, device="cpu", layout=DDP4) == on
    with pytest.raises(AccountingError, match="FakeTensors do not have"):
        measure_hf_step(cfg, S, 1, setup, device="meta", layout=DDP4)


SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c)
    for a, p, c in itertools.product(("naive", "sdpa"), ("fp32", "bf16", "amp-bf16"), ("none", "full"))
]


GRID = [
    (name, world, setup)
    for name in MODELS
    for world in (2, 4)
    for setup in SETUPS
    if not (name == "gemma2" and setup.attention == "sdpa")  # transformers refuses sdpa for Gemma 2
]


@pytest.mark.grid
@pytest.mark.parametrize("name, world, setup", GRID, ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v))
def test_ddp_grid(name, world, setup):
    """Every model, world 2 and 4, eager and sdpa, fp32 / bf16 / amp-bf16 (autocast: the single-GPU program),
    without and with full checkpointing."""
    check(name, setup, world)


FIND_UNUSED = [
    (name, world, setup)
    for name in MODELS
    for world in (2, 4)
    for setup in SETUPS
    if setup.checkpoint == "none" and not (name == "gemma2" and setup.attention == "sdpa")
]


@pytest.mark.grid
@pytest.mark.parametrize(
    "name, world, setup", FIND_UNUSED, ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v)
)
def test_find_unused_parameters_grid(name, world, setup):
    """``find_unused_parameters=True`` (the HF Trainer's without checkpointing), on real CPU tensors: every model,
    world 2 and 4, eager and sdpa, every precision."""
    check(name, setup, world, find_unused=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, setup, zero",
    [
        ("llama", TrainingSetup(), 0),
        ("gpt2", TrainingSetup(precision="amp-bf16", attention="sdpa"), 0),
        ("qwen3_moe", TrainingSetup(precision="bf16"), 0),
        ("nemotron_h", TrainingSetup(precision="amp-bf16"), 0),
        ("qwen3", TrainingSetup(precision="bf16"), 1),
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v),
)
def test_find_unused_parameters_equals_the_cpu_job(name, setup, zero):
    check(name, setup, 2, zero=zero, rank=zero, find_unused=True)


ZERO1 = [
    (name, world, precision, rank, optimizer)
    for name in MODELS
    for world in (2, 4)
    for precision in ("fp32", "bf16", "amp-bf16")
    for rank, optimizer in ((0, "foreach"), (world - 1, "for-loop"))
]


@pytest.mark.grid
@pytest.mark.parametrize("name, world, precision, rank, optimizer", ZERO1, ids=str)
def test_zero1_grid(name, world, precision, rank, optimizer):
    """ZeRO-1 (``ZeroRedundancyOptimizer`` around AdamW, beside DDP): rank 0 and the last rank, foreach and the
    for-loop (its temporaries follow ZeRO's largest-first order), every precision."""
    check(name, TrainingSetup(precision=precision, optimizer=optimizer), world, zero=1, rank=rank)


def test_zero1_ranks_own_whole_tensors_by_hand():
    """World 4, fp32: tiny("llama")'s tensors largest first (embedding and head 1,536 elements, twelve of 384,
    eight of 256, eight of 128, nine norms of 16), each to the least-loaded rank (the lowest on a tie): ranks 0
    and 1 take the two 1,536s, ranks 2 and 3 four 384s each, then all four grow alike; the ninth norm goes to
    rank 0, which owns 2,736 elements, the others 2,720 (sum N).  A rank's baseline is DDP's less the moments of
    what it does not own: 8·N + 8·owned + the token ids and rotary buffers."""
    cfg, layout = tiny("llama"), ParallelLayout(dp=4, zero=1)
    owned = [2_736, 2_720, 2_720, 2_720]
    assert sum(owned) == N
    for rank, n in enumerate(owned):
        step = predict_rank(
            cfg, S, TrainingSetup(), layout, impl="transformers", batch=B, replicate=Replicate(layout, rank)
        )
        assert step.at(B).baseline == 8 * N + 8 * n + 2 * B * S * 8 + 2 * 2 * 4
    assert step.at(B).baseline == 109_200


@pytest.mark.slow
def test_zero1_rank_equals_the_fake_pg_job():
    check("qwen3", TrainingSetup(precision="amp-bf16", checkpoint="full", attention="sdpa"), 4, zero=1, rank=1)


# the reducer's rebuilt buckets: a model of 2.2M parameters (8.6 MB of fp32 gradients), so the 1 MiB first bucket
# closes early; the rebuild reads the ranks' bucket order (data): real CPU tensors, two steps
WIDE = dict(vocab_size=4096, d_model=128, num_heads=4, num_kv_heads=2, d_ff=352, num_layers=6, head_dim=None)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_second_steps_rebuilt_buckets_equal_the_fake_pg_job(name):
    """Second step: Llama's buckets by hand: reverse order, the LM head (4096·128 fp32 = 2 MiB) closes the first
    bucket alone; the other 6,527,488 bytes stay under 25 MiB.  GPT-2 (tied: wte is its first parameter, so last
    in reverse order): the final norm and the last block's tensors reach 1 MiB first.  The step's memory is the
    first step's (the rebuilt buffers hold the same bytes)."""
    if name == "gpt2":
        cfg = config_from_hf(dict(model_type="gpt2", vocab_size=4096, n_embd=128, n_layer=6, n_head=4, n_positions=64))
    else:
        cfg = dataclasses.replace(load_config("llama-3-8b"), context_length=64, **WIDE)
    setup, layout = TrainingSetup(), ParallelLayout(dp=2, zero=0)
    rep = Replicate(layout)
    lines = predict_rank(cfg, S, setup, layout, impl="transformers", batch=B, replicate=rep)
    calls: list = []
    assert measure_hf_rank(cfg, S, B, setup, layout, fake=False, collectives=calls, steps=2) == lines.at(B)
    got = [b for kind, b, _ in calls if kind == "all_reduce"]
    assert got == rep.all_reduces(first_step=False)
    if name == "llama":
        assert got == [4096 * 128 * 4, 6_527_488]
    assert len(got) == 2 and got[0] >= 1024 * 1024


def test_a_layout_the_job_does_not_run_is_refused_in_one_line():
    cfg = tiny("llama")
    with pytest.raises(AccountingError, match="tensor parallel is run alone"):
        measure_hf_step(cfg, S, 1, TrainingSetup(), device="meta", layout=ParallelLayout(dp=2, tp=2))
