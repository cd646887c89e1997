"""Tensor and sequence parallel on the fake process group, beyond tests/test_parallel_measured.py's
grid: checkpointing, every precision and attention kernel, a second batch size; and the storage
tracker's view of DTensor's functional collectives.

Exact, every phase byte for byte: TP and TP+SP on the whole grid; TP+SP+VP in every precision (the
replay runs the sequence-parallel rank: ``replay_training_step(sp=M)``), amp-bf16 over every attention
kernel, checkpointing and batch 1 and 2 (``test_sp_rank_is_exact_on_the_grid``); TP and TP+VP on a
narrow model where TP's all-reduces set the peaks (``test_tp_all_reduces_where_they_set_the_peaks``)."""

import dataclasses

import pytest

pytest.importorskip("torch")

from test_parallel_measured import TINY, S

from lm_accounting.analytic.parallel import rank_step
from lm_accounting.config import ModelConfig
from lm_accounting.layout import ParallelLayout
from lm_accounting.measure.distributed import measure_rank
from lm_accounting.setup import TrainingSetup

TP, SP = ParallelLayout(tp=2), ParallelLayout(tp=2, sequence_parallel=True)
GRID = [  # (attention, checkpoint, precision, batch): both kernels, both checkpointings, each precision
    ("naive", "full", "fp32", 1),
    ("naive", "selective", "bf16", 1),
    ("naive", "none", "amp-bf16", 1),
    ("sdpa", "full", "bf16", 1),
    ("sdpa", "selective", "fp32", 1),
    ("sdpa", "full", "amp-bf16", 1),
    ("sdpa", "full", "fp32", 2),
    ("naive", "selective", "amp-bf16", 2),
]


def test_a_functional_collective_allocates_its_output_once():
    """DTensor's collectives return ``AsyncCollectiveTensor(output)``, a wrapper with a storage of the
    output's size and no memory: ``RankTracker`` counts the output, not the wrapper.  An all-reduce of
    a (16, 24) fp32 tensor: 16·24·4 = 1,536 bytes, once."""
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    from lm_accounting.measure.distributed import RankTracker, init_fake_group

    init_fake_group(2, 0)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("wrap_test",))
    x = torch.ones(16, 24)
    tracker = RankTracker()
    with tracker:
        y = funcol.all_reduce(x, "sum", (mesh, 0))
        assert type(y).__name__ == "AsyncCollectiveTensor"
        assert tracker.live_bytes("cpu") == 1_536
        y = y.wait()  # the output itself
        assert tracker.live_bytes("cpu") == 1_536
        del y
    assert tracker.live_bytes("cpu") == 0 and tracker.peak[torch.device("cpu")] == 1_536


@pytest.mark.grid
@pytest.mark.parametrize("lay", [TP, SP], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("case", GRID, ids=lambda c: "+".join(map(str, c)))
def test_tp_and_sp_step_is_exact(case, lay):
    """Every phase's peak and end, byte for byte, and the output says so.  Under sequence parallel the
    replay runs the rank's own norms and residual stream (T/M rows) with the all-gathers and
    reduce-scatters around the projections, in the forward, a checkpointed block's recompute and the
    backward (before: the TP-local recompute with whole norms and residual stream, up to 5 % high)."""
    from lm_accounting.analytic.parallel_report import parallel_memory

    attention, checkpoint, precision, batch = case
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    m = measure_rank(TINY, S, batch, setup, lay)
    assert m.step == rank_step(TINY, S, batch, setup, lay, mode="traced")[0]
    assert parallel_memory(TINY, S, batch, setup, lay).peaks_exact


# the blocks set the peaks here (vocab 64 < d_model 128, d_ff 512, S 64; 2 local kv heads), where on TINY the
# LM head, the loss or the embedding's backward set them
BLOCKS = ModelConfig(
    vocab_size=64, context_length=64, num_layers=2, d_model=128, num_heads=8, num_kv_heads=4, d_ff=512, name="blocks"
)
SP_GRID = [  # (model, S, precision, attention, checkpoint, batch)
    *[("tiny", S, "amp-bf16", a, c, b) for a in ("naive", "sdpa") for c in ("none", "full", "selective") for b in (1, 2)],
    *[("blocks", 64, "amp-bf16", a, c, b) for a in ("naive", "sdpa") for c in ("none", "full", "selective") for b in (1, 2)],
    *[("blocks", 64, p, a, c, 2) for p in ("fp32", "bf16") for a in ("naive", "sdpa") for c in ("none", "full", "selective")],
]  # fmt: skip


@pytest.mark.grid
@pytest.mark.parametrize("lay", [SP, ParallelLayout(tp=2, sequence_parallel=True, vocab_parallel=True)],
                         ids=["tp+sp", "tp+sp+vp"])  # fmt: skip
@pytest.mark.parametrize("case", SP_GRID, ids=lambda c: "+".join(map(str, c)))
def test_sp_rank_is_exact_on_the_grid(case, lay):
    """amp-bf16 (autocast, fp32 parameters) with sequence parallel, the rank replayed as such: the norms
    run in fp32 on T/M rows and their fp32 output is all-gathered (the projections take bf16 copies of the
    whole), each row-parallel output is a bf16 partial sum reduce-scattered in bf16 and added to the fp32
    residual stream; in the backward the fp32 gradient is cast to bf16 at T/M rows and all-gathered, an
    input gradient reduce-scattered in fp32; a norm's two paths to x are summed in its DTensor (out of
    place) before joining the residual stream's gradient; at B = 2 every all-gather ends in a cat.
    Every phase byte for byte, and the output calls the peaks exact.  Before, the TP-local replay shifted
    by the sequence-parallel saving: on TINY, with vocab parallel and checkpointing, 768 bytes low to 512
    high at B = 1 and 1,536 low at B = 2 (naive, full); on BLOCKS every case off, e.g. naive + full at B = 2
    98,560 bytes low in the forward and 32,768 in the backward, sdpa without checkpointing at B = 2
    98,048 high in the backward while called exact.  fp32 and bf16 on BLOCKS at B = 2: the all-gathers'
    cat and the norms' DTensor sums, shared with amp-bf16."""
    from lm_accounting.analytic.parallel_report import parallel_memory

    model, seq, precision, attention, checkpoint, batch = case
    cfg = TINY if model == "tiny" else BLOCKS
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    m = measure_rank(cfg, seq, batch, setup, lay)
    assert m.step == rank_step(cfg, seq, batch, setup, lay, mode="traced")[0]
    assert parallel_memory(cfg, seq, batch, setup, lay).peaks_exact


VP, SPVP = ParallelLayout(tp=2, vocab_parallel=True), ParallelLayout(tp=2, sequence_parallel=True, vocab_parallel=True)
VP_GRID = [  # (attention, checkpoint, precision)
    ("naive", "none", "fp32"),
    ("naive", "full", "bf16"),
    ("naive", "selective", "amp-bf16"),
    ("sdpa", "none", "bf16"),
    ("sdpa", "selective", "fp32"),
    ("sdpa", "full", "amp-bf16"),
]


@pytest.mark.grid
@pytest.mark.parametrize("lay", [VP, SPVP], ids=["tp+vp", "tp+sp+vp"])
@pytest.mark.parametrize("case", VP_GRID, ids=lambda c: "+".join(c))
def test_vocab_parallel_rank(case, lay):
    """Vocab parallel on the fake process group (row-wise embedding, column-wise LM head, the loss under
    ``loss_parallel``), TP rank 0 (51 of the 101 vocabulary rows): model states, every phase, the AdamW
    step, every collective and the local matmul FLOPs byte for byte (before TP's all-reduces were replayed,
    the backward peak in sdpa + amp-bf16 with checkpointing was 160 bytes low: a column-parallel input
    gradient's all-reduce output in a recomputed block); with sequence parallel exact in every precision (the sequence-parallel rank replayed: the embedding's output
    reduce-scattered, ln_final's all-gathered, their gradients' mirror images; before, under amp-bf16 with
    checkpointing, the TP-local replay shifted by the saving was 768 bytes low, naive + selective, and
    512 high, sdpa + full)."""
    from lm_accounting.analytic.collectives import step_collectives, totals
    from lm_accounting.analytic.parallel import model_states, rank_flops

    attention, checkpoint, precision = case
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    m = measure_rank(TINY, S, 1, setup, lay)
    st = model_states(TINY, setup, lay)
    e = 2 if precision == "bf16" else 4
    # torch 2.13's embedding_dense_backward has no row-wise strategy: the embedding's gradient is the
    # whole 101 × 24 table, 50 rows more than its parameter (hand count)
    assert m.gradients - m.params == 50 * 24 * e
    assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert m.collectives == totals(step_collectives(TINY, S, 1, setup, lay, first_step=True))
    assert m.local_flops == rank_flops(TINY, S, 1, setup, lay).hardware
    assert m.step == rank_step(TINY, S, 1, setup, lay, mode="traced")[0]


def test_vocab_parallel_head_saves_the_log_softmax_not_the_course_tensors():
    """Hand count, fp32, T = 16, Vl = 51: loss_parallel saves its log-softmax output, 16·51·4 = 3,264
    bytes, plus the loss and the total weight (4 each); the course loss would save z and exp over the
    whole vocabulary, 2·16·101·4 = 12,928 bytes, and Σ, its log-sum-exp and the loss."""
    from lm_accounting.analytic.tensor_parallel import vocab_parallel_head_saved

    assert vocab_parallel_head_saved(TINY, S, 1, TrainingSetup(), 2) == 3_264 + 8


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [("none", "fp32"), ("none", "amp-bf16"), ("full", "bf16"), ("selective", "bf16")], ids="+".join
)
def test_one_local_head_is_exact(case):
    """h = 2 over tp = 2: one head per rank, whose fused-attention output merges by a view (no copy:
    ``Sizes.merge_copy``); every phase byte for byte (before: T·d_head·e per layer high without
    checkpointing, one layer's under checkpointing in bf16)."""
    checkpoint, precision = case
    cfg = ModelConfig(vocab_size=101, context_length=16, num_layers=2, d_model=24, num_heads=2, d_ff=40, name="h2")
    setup = TrainingSetup(attention="sdpa", checkpoint=checkpoint, precision=precision)
    assert measure_rank(cfg, S, 1, setup, TP).step == rank_step(cfg, S, 1, setup, TP, mode="traced")[0]


LLAMA_LIKE = dict(num_layers=2, d_model=1024, num_heads=8, num_kv_heads=8, head_dim=128, d_ff=3584, vocab_size=8000)


@pytest.mark.grid
@pytest.mark.parametrize(
    "lay",
    [ParallelLayout(tp=4, sequence_parallel=True), ParallelLayout(dp=2, zero=3, tp=4, sequence_parallel=True)],
    ids=["tp4+sp", "dp2·zero3·tp4+sp"],
)
@pytest.mark.parametrize("checkpoint,precision", [("full", "bf16"), ("selective", "amp-bf16"), ("full", "fp32")])
def test_sp_at_a_realistic_shape_is_exact_and_says_so(lay, checkpoint, precision):
    """Llama-like blocks (d 1,024, 8 heads, d_ff 3,584, vocab 8,000) at S = 2,048 with SP: the traced
    run's peaks are byte-exact against the real job, and the output calls them exact: the replay runs
    the sequence-parallel rank itself in every precision (under FSDP2, whose bf16 parameters make
    amp-bf16 the bf16 model, as the bf16 rank)."""
    import dataclasses

    from lm_accounting import load_config
    from lm_accounting.analytic.parallel_report import parallel_memory

    cfg = dataclasses.replace(load_config("llama-3-8b"), **LLAMA_LIKE).with_context(2048)
    setup = TrainingSetup(attention="sdpa", checkpoint=checkpoint, precision=precision)
    assert parallel_memory(cfg, 2048, 1, setup, lay).peaks_exact
    assert measure_rank(cfg, 2048, 1, setup, lay).step == rank_step(cfg, 2048, 1, setup, lay, mode="traced")[0]


# d_ff/M and h/M heads below d_model (as Llama's at tp 8), vocab 16: TP's all-reduces of (T x d) partial sums
# set the peaks, where on TINY and BLOCKS the head, the loss or the d_ff intermediates hide them
NARROW = ModelConfig(
    vocab_size=16, context_length=64, num_layers=2, d_model=128, num_heads=8, num_kv_heads=8, d_ff=128, name="narrow"
)
NARROW_GRID = [  # (precision, attention, checkpoint, batch)
    (p, a, c, b)
    for p in ("fp32", "bf16", "amp-bf16")
    for a in ("naive", "sdpa")
    for c in ("none", "full", "selective")
    for b in (1, 2)
]


@pytest.mark.grid
@pytest.mark.parametrize(
    "lay", [ParallelLayout(tp=4), ParallelLayout(tp=4, vocab_parallel=True)], ids=["tp4", "tp4+vp"]
)
@pytest.mark.parametrize("case", NARROW_GRID, ids=lambda c: "+".join(map(str, c)))
def test_tp_all_reduces_where_they_set_the_peaks(case, lay):
    """Each row-parallel output (attention's output projection, w2) and each column-parallel input's
    gradient (q, k, v, w1, w3) is a (T x d) partial sum that DTensor all-reduces out of place: the clone
    lives beside the partial for one op (``replay._tp_all_reduce``).  Every phase byte for byte.  Before
    they were replayed, measured here: TP in fp32 with checkpointing at B = 2, the backward peak 16,384
    bytes low (a w1/w3 input gradient's all-reduce in the recomputed block); TP + VP sdpa, full, fp32
    32,768 low in the forward at B = 1 (an output projection's all-reduce) and 65,536 + 16,384 at B = 2."""
    precision, attention, checkpoint, batch = case
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    m = measure_rank(NARROW, 64, batch, setup, lay)
    assert m.step == rank_step(NARROW, 64, batch, setup, lay, mode="traced")[0]


PLAIN_TP_GRID = [
    (lay, case)
    for lay, cases in [
        (ParallelLayout(tp=4), NARROW_GRID),
        (ParallelLayout(tp=4, sequence_parallel=True), NARROW_GRID[1::3]),
        (ParallelLayout(dp=2, zero=3, tp=4), NARROW_GRID[2::3]),
        (ParallelLayout(dp=2, zero=2, tp=4, sequence_parallel=True), NARROW_GRID[::3]),
        (ParallelLayout(tp=4, vocab_parallel=True), NARROW_GRID[1::2]),
        (ParallelLayout(dp=2, zero=3, tp=4, sequence_parallel=True, vocab_parallel=True), NARROW_GRID[::4]),
    ]
    for case in cases
]


@pytest.mark.grid
@pytest.mark.parametrize(
    "lay,case", PLAIN_TP_GRID, ids=lambda x: x.label if isinstance(x, ParallelLayout) else "+".join(map(str, x))
)
def test_the_plain_tp_run_equals_the_cpu_allocator(lay, case):
    """What a GPU user gets is the plain run (no dispatch mode: autograd accumulates in place where a
    traced run copies, e.g. the all-reduced input gradients of q, k, v and w1, w3, contiguous and
    unshared).  The TP rank on real CPU tensors, with no mode at all, read from the CPU allocator's own
    events (``measure_rank_plain``), equals the plain prediction for a CPU byte for byte.  Before, the
    prediction without the all-reduces was up to 54,768 bytes low here (sdpa, full, fp32, B = 2), and
    rank_step's forward end left out the CPU's wrapped 1/√d_head that naive attention keeps (8 bytes a
    layer).  Vocab parallel too: its replay kept the meta run's step counters and none of the CPU's
    extras (84 and 100 bytes low on a 2-layer model)."""
    torch = pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank_plain

    precision, attention, checkpoint, batch = case
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    got = measure_rank_plain(NARROW, 64, batch, setup, lay)
    threads = torch.get_num_threads()
    want = rank_step(NARROW, 64, batch, setup, lay, mode="plain", device="cpu", cpu_threads=threads)[0]
    assert got == want, (setup.label, batch)


@pytest.mark.slow
def test_the_plain_vocab_parallel_run_at_a_large_vocabulary():
    """Vocab parallel's own tensors set the peaks at 2,000 rows (500 a rank): the plain run equals the CPU
    allocator in fp32 and amp-bf16, alone and under FSDP2."""
    torch = pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank_plain

    cfg, threads = dataclasses.replace(NARROW, vocab_size=2000), torch.get_num_threads()
    for lay in (ParallelLayout(tp=4, vocab_parallel=True), ParallelLayout(dp=2, zero=2, tp=4, vocab_parallel=True)):
        for precision in ("fp32", "amp-bf16"):
            setup = TrainingSetup(attention="sdpa", precision=precision)
            want = rank_step(cfg, 64, 1, setup, lay, mode="plain", device="cpu", cpu_threads=threads)[0]
            assert measure_rank_plain(cfg, 64, 1, setup, lay) == want, (lay.label, precision)


def test_the_plain_run_refuses_pipeline_parallel_in_one_line():
    pytest.importorskip("torch")
    from lm_accounting.config import AccountingError
    from lm_accounting.measure.distributed import measure_rank_plain

    with pytest.raises(AccountingError, match="not DDP, ZeRO-1 or pipeline parallel"):
        measure_rank_plain(NARROW, 64, 1, TrainingSetup(), ParallelLayout(tp=4, pp=2, micro_batches=2))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "amp-bf16"])
@pytest.mark.parametrize("checkpoint", ["none", "selective"])
def test_vocab_parallel_ranks_run_cudas_attention_kernels_too(precision, checkpoint):
    """A TP rank's blocks are the same with or without vocab parallel, so a CUDA prediction moves away from
    the meta one by the same bytes in both: CUDA's fused kernels (``Sizes.lse``: flash's rng state, the
    memory-efficient kernel's padded logsumexp; ``merge_copy``: its output merged by a view).  Measured on
    an H200: tp2+sp+vp sdpa fp32 was 3,145,728 B (the merged heads, T·d/2·4 per layer) above the plain
    run in the forward, amp-bf16 48 B below (rng state, 24 B per layer), before the vocab-parallel
    replay was told it runs on CUDA."""
    setup = TrainingSetup(attention="sdpa", checkpoint=checkpoint, precision=precision)

    def moved(lay):
        on = {d: rank_step(NARROW, 48, 2, setup, lay, "plain", 0, d)[0] for d in ("cuda", "meta")}  # S ≠ 0 mod 32
        return on["cuda"].forward.end - on["meta"].forward.end

    for sp in (False, True):
        tp = moved(ParallelLayout(tp=4, sequence_parallel=sp))
        assert tp != 0 and moved(ParallelLayout(tp=4, sequence_parallel=sp, vocab_parallel=True)) == tp
