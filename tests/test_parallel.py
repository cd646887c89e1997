"""Parallel layouts, analytic side (no torch): validation, hand-computed shards, the ZeRO partition,
the sharding degree (dp, never the world), the CLI's one-line errors and its torch-free path."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_views import key_paths

from lm_accounting.analytic.parallel import (
    fsdp_chunk_rows,
    fsdp_rank_rows,
    local_config,
    model_states,
    zero1_owners,
)
from lm_accounting.analytic.parallel_report import parallel_memory
from lm_accounting.config import AccountingError, ModelConfig, load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

TINY = ModelConfig(vocab_size=101, context_length=16, num_layers=2, d_model=24, num_heads=4, d_ff=40, name="tiny")
SNAPSHOT = Path(__file__).parent / "snapshots" / "json_keys.json"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(zero=4), "zero stage must be 0, 1, 2 or 3"),
        (dict(dp=0), "dp must be a positive integer"),
        (dict(sequence_parallel=True), "sequence parallel needs tp > 1"),
        (dict(vocab_parallel=True), "vocab parallel needs tp > 1"),
        (dict(pp=4, micro_batches=2), "needs at least 4 micro-batches"),
        (dict(ep=2), "ep=2 needs FSDP2"),
        (dict(dp=6, zero=3, ep=4), "ep=4 does not divide dp=6"),
    ],
)
def test_bad_layouts_are_refused_with_one_line(kwargs, message):
    with pytest.raises(AccountingError, match=message):
        ParallelLayout(**kwargs)


@pytest.mark.parametrize(
    ("cfg", "tp", "message"),
    [
        (TINY, 3, r"tp=3 does not divide the heads \(4\)"),
        (load_config("llama-3-8b"), 16, r"tp=16 does not divide the kv heads \(8\)"),
        (ModelConfig(vocab_size=8, context_length=4, num_layers=1, d_model=8, num_heads=2, d_ff=6), 4, "heads"),
        (ModelConfig(vocab_size=8, context_length=4, num_layers=1, d_model=8, num_heads=4, d_ff=6), 4, "d_ff"),
    ],
)
def test_tp_must_divide_heads_kv_heads_and_d_ff(cfg, tp, message):
    with pytest.raises(AccountingError, match=message):
        ParallelLayout(tp=tp).check(cfg)


def test_sequence_parallel_needs_positions_that_split_evenly(run_cli):
    """The job shards (B, S, d) along S (``Shard(1)``); at S = 15 over tp = 2 the live job itself fails
    (a 16- against a 15-position tensor inside attention), so the layout is refused up front, in one line."""
    with pytest.raises(AccountingError, match="splits the 15 positions over tp=2"):
        ParallelLayout(tp=2, sequence_parallel=True).check(TINY, 15)
    ParallelLayout(tp=2, sequence_parallel=True).check(TINY, 16)
    ParallelLayout(tp=2).check(TINY, 15)  # without sequence parallel S is whole on every rank
    r = run_cli("memory", "llama-3-8b", "--context", "4095", "--dp", "8", "--zero", "3", "--tp", "2", "--sp")
    assert r.code == 2 and r.err.strip().count("\n") == 0 and "use a multiple of 2" in r.err


def test_world_is_the_product_of_the_degrees():
    lay = ParallelLayout(dp=8, zero=3, tp=4, sequence_parallel=True, pp=2, micro_batches=8)
    assert lay.world == 64 and lay.label == "dp8·zero3·tp4+sp·pp2x8"
    assert lay.to_dict()["world"] == 64 and lay.to_dict()["data_parallel"] == "FSDP2 (ZeRO-3)"


def test_fsdp_shards_written_out_by_hand():
    # The 101 × 24 embedding over 4 ranks: chunk ceil(101/4) = 26 rows; ranks 0-2 hold 26, rank 3 holds
    # 101 − 78 = 23; every rank stores 26 rows (padded).
    assert fsdp_chunk_rows(101, 4) == 26
    assert [fsdp_rank_rows(101, 4, r) for r in range(4)] == [26, 26, 26, 23]
    # A 3-row tensor over 4 ranks: chunk 1; rank 3 holds nothing.
    assert [fsdp_rank_rows(3, 4, r) for r in range(4)] == [1, 1, 1, 0]
    # Whole tiny model over dp = 4, fp32.  Per layer: ln1 24 (chunk 6), q/k/v/o 24×24 (chunk 6 rows
    # of 24), ln2 24, w1 and w3 40×24 (chunk 10 rows of 24), w2 24×40 (chunk 6 rows of 40):
    # 6 + 4·144 + 6 + 240 + 240 + 240 = 1,308 elements; embedding and LM head 26·24 = 624 each;
    # ln_final 6.  Padded storage: 2·1,308 + 2·624 + 6 = 3,870 elements = 15,480 bytes.
    st = model_states(TINY, TrainingSetup(), ParallelLayout(dp=4, zero=3))
    assert st.parameters == st.gradients == 15_480
    # Rank 0 (the worst) holds full chunks: AdamW's m and v, 2 · 3,870 · 4 bytes.
    assert st.rank == 0 and st.optimizer == 30_960
    # Rank 3: embedding and LM head 23·24 = 552 each instead of 624: 2 · (3,870 − 144) · 4.
    assert model_states(TINY, TrainingSetup(), ParallelLayout(dp=4, zero=3), rank=3).optimizer == 29_808


def test_zero1_partition_by_hand():
    # Largest first to the least-loaded rank (lowest index on a tie): 10→r0; 7→r1; 5→r1 (7 < 10);
    # 3→r0 (10 < 12); 3→r1 (12 < 13).
    assert zero1_owners([3, 10, 5, 7, 3], 2) == [0, 0, 1, 1, 1]


def test_zero_shards_divide_by_dp_not_by_the_world():
    """The EleutherAI cookbook's convention divides ZeRO shards by all GPUs; under dp × tp the
    shard degree is dp, applied to the TP-local model."""
    cfg = ModelConfig(vocab_size=256, context_length=64, num_layers=2, d_model=64, num_heads=8, d_ff=256)
    lay = ParallelLayout(dp=8, zero=3, tp=2)
    # TP-local elements (every dim divides): embedding and LM head 256·64 each, whole; per layer
    # 2 norms of 64, q/k/v/o 4·(64·64)/2, w1/w2/w3 3·(256·64)/2; final norm 64.
    local = 2 * 256 * 64 + 2 * (2 * 64 + 4 * 64 * 64 // 2 + 3 * 256 * 64 // 2) + 64
    states = model_states(cfg, TrainingSetup(), lay)
    assert states.optimizer == 2 * 4 * local // 8  # fp32 m and v, sharded by dp = 8
    total = 2 * 256 * 64 + 2 * (2 * 64 + 4 * 64 * 64 + 3 * 256 * 64) + 64
    assert states.optimizer != 2 * 4 * total // lay.world  # the cookbook's figure
    assert local_config(cfg, lay).num_heads == 4 and local_config(cfg, lay).d_ff == 128


def test_allowance_is_its_own_figure():
    """The allowance is kept back from the GPU's CUDA total (the H100's 79.11 GiB = 84,943,715,696 bytes):
    the budget is the rest, and the peak alone is compared with it."""
    r = parallel_memory(TINY, 16, 1, TrainingSetup(), ParallelLayout(dp=4, zero=3), allowance=123)
    d = r.to_dict()
    assert d["allowance"] == 123 and d["budget"] == 84_943_715_696 - 123
    assert d["fits"] is (d["peak"] <= 84_943_715_696 - 123)
    assert d["peak"] == max(d["step"][p]["peak"] for p in ("forward", "backward", "optimizer_step"))


def test_json_schema_and_pinned_keys(run_cli):
    r = run_cli(
        "memory", "llama-3-8b", "--context", "8192", "--dp", "8", "--zero", "3", "--tp", "2", "--format", "json"
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["schema"] == "lm-accounting/parallel-memory/7"
    pinned = json.loads(SNAPSHOT.read_text())["memory-parallel"]
    assert sorted(key_paths(data)) == pinned


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "3"], "tp=3 does not divide the heads (32)"),
        (["--zero", "5"], "--zero"),
        (["--sp"], "sequence parallel needs tp > 1"),
        (["--dp", "2", "--zero", "3", "--measure", "cuda"], "fake process group"),
    ],
)
def test_cli_bad_layouts_exit_2_with_one_line(run_cli, args, message):
    r = run_cli("memory", "llama-3-8b", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err


def test_memory_with_a_layout_imports_no_torch():
    code = (
        "import sys; from lm_accounting.cli import main\n"
        "try:\n main(['memory','llama-3-8b','--dp','64','--zero','3','--context','8192','--format','json'])\n"
        "except SystemExit: pass\n"
        "assert not {'torch','pandas','matplotlib'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@pytest.mark.parametrize(
    ("preset", "args", "message"),
    [
        ("openai-gpt2", [], "course architecture"),
        ("mixtral-8x7b", ["--tp", "2"], "tensor and pipeline parallel are not"),
        ("deepseek-v3", ["--pp", "2"], "tensor and pipeline parallel are not"),
    ],
)
def test_uncovered_architectures_are_refused_with_one_line(run_cli, preset, args, message):
    r = run_cli("memory", preset, "--dp", "8", "--zero", "3", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err


def test_pipeline_stages_by_hand():
    """pp = 2 over the 2-layer tiny model, 4 micro-batches, fp32, one GPU per stage."""
    from lm_accounting.analytic.parallel import stage_layers
    from lm_accounting.analytic.pipeline import pipeline_stages

    lay = ParallelLayout(pp=2, micro_batches=4)
    assert list(stage_layers(5, 2, 0)) == [0, 1, 2] and list(stage_layers(5, 2, 1)) == [3, 4]
    # Stage 0: embedding 101·24 + one block (24 + 4·24·24 + 24 + 3·40·24 = 5,232): 7,656 parameters.
    # Stage 1: one block + final norm 24 + LM head 101·24: 7,680.
    assert model_states(TINY, TrainingSetup(), lay, stage=0).parameters == 7_656 * 4
    assert model_states(TINY, TrainingSetup(), lay, stage=1).parameters == 7_680 * 4
    stage, step, _, st, act = pipeline_stages(TINY, 16, 1, TrainingSetup(), lay)
    # 1F1B: stage 0 holds min(P, m) = 2 micro-batches of one block's saved activations.
    one_block = parallel_memory(TINY.with_context(16), 16, 1, TrainingSetup(), ParallelLayout()).activations
    two_blocks_minus_one = parallel_memory(
        ModelConfig(vocab_size=101, context_length=16, num_layers=1, d_model=24, num_heads=4, d_ff=40),
        16,
        1,
        TrainingSetup(),
        ParallelLayout(),
    ).activations
    per_block = one_block - two_blocks_minus_one  # the 2-layer model's saved bytes less the 1-layer's
    assert stage == 0 and act == 2 * per_block  # stage 1 holds 1 block + the head for 1 micro-batch: less
    assert step.peak >= st.total


def test_the_saved_activations_are_the_replays_forward_end():
    """``rank_step`` takes a rank's forward end from the TP-local replay R (so that a plain CPU run keeps
    the CPU allocator's extras); ``saved_activations`` says what that end holds above the baseline.  The
    two are computed independently (the activations' formulas, ``analytic.activations``, and the replay's
    program-order events) and agree on every non-FSDP2 layout, setup and batch of this grid, on meta."""
    import itertools

    from lm_accounting.analytic.parallel import saved_activations, single_rank_step

    tiny = ModelConfig(
        vocab_size=101, context_length=16, num_layers=2, d_model=24, num_heads=4, num_kv_heads=2, d_ff=40, name="tiny"
    )
    narrow = ModelConfig(
        vocab_size=16, context_length=64, num_layers=2, d_model=128, num_heads=8, num_kv_heads=8, d_ff=128, name="n"
    )
    layouts = [
        ParallelLayout(dp=4, zero=0),
        ParallelLayout(dp=4, zero=1),
        ParallelLayout(tp=2),
        ParallelLayout(tp=2, sequence_parallel=True),
        ParallelLayout(tp=2, vocab_parallel=True),
        ParallelLayout(tp=2, sequence_parallel=True, vocab_parallel=True),
        ParallelLayout(dp=2, zero=1, tp=2),
    ]
    for (cfg, seq), lay, a, c, p, batch, mode in itertools.product(
        ((tiny, 16), (narrow, 64)), layouts, ("naive", "sdpa"), ("none", "full", "selective"), ("fp32", "bf16", "amp-bf16"), (1, 2),
        ("traced", "plain"),
    ):  # fmt: skip
        setup = TrainingSetup(attention=a, checkpoint=c, precision=p)
        r = single_rank_step(cfg, seq, batch, setup, lay, mode)
        assert r.forward.end - r.baseline == saved_activations(cfg, seq, batch, setup, lay), (lay.label, setup.label)


def test_vocab_parallel_flops_are_one_micro_batchs_without_pipeline_parallel():
    """Without pipeline parallel ``rank_flops`` is one micro-batch's step, whatever the accumulation count:
    the vocab-parallel head's cut was taken once per micro-batch (``--micro-batches 4`` gave negative FLOPs).
    Hand count: TINY untied, T = 16, d = 24, V = 101 over tp 2 (Vl = 51): the head's forward 2·16·24·51."""
    import dataclasses

    from lm_accounting.analytic.parallel import rank_flops

    cfg = dataclasses.replace(TINY, tie_embeddings=False)
    one, four = (ParallelLayout(tp=2, vocab_parallel=True, micro_batches=m) for m in (1, 4))
    setup = TrainingSetup()
    assert rank_flops(cfg, 16, 1, setup, four) == rank_flops(cfg, 16, 1, setup, one)
    whole = rank_flops(cfg, 16, 1, setup, ParallelLayout(tp=2))
    assert whole.forward - rank_flops(cfg, 16, 1, setup, one).forward == 2 * 16 * 24 * (101 - 51)
