"""Mixture-of-experts and latent-attention (MLA) models in parallel layouts: the parameter list against
the live model, DDP / ZeRO-1 / FSDP2 model states and collectives against one rank of the real job on
torch's fake process group, and expert parallel."""

import dataclasses
import itertools
import json

import pytest

from lm_accounting.analytic.collectives import step_collectives, totals
from lm_accounting.analytic.expert_parallel import ExpertParallelSplit, expert_parallel_plan, expert_parallel_split
from lm_accounting.analytic.fsdp import Unit, fsdp_units
from lm_accounting.analytic.parallel import (
    expert_rows,
    model_states,
    parameter_shapes,
    rank_flops,
    rank_step,
    stage_parameters,
)
from lm_accounting.analytic.parallel_report import parallel_memory
from lm_accounting.config import AccountingError, ModelConfig, load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

TINY = dict(vocab_size=101, context_length=16, d_model=24, num_heads=4, d_ff=40)
MIXTRAL = ModelConfig(**TINY, num_layers=2, num_kv_heads=2, num_experts=4, experts_per_token=2, name="tiny-mixtral")
QWEN3_MOE = ModelConfig(
    **TINY, num_layers=3, num_kv_heads=2, head_dim=8, qk_norm=True, num_experts=6, experts_per_token=2,
    expert_d_ff=12, moe_every=2, tie_embeddings=True, name="tiny-qwen3-moe",
)  # fmt: skip
DEEPSEEK = ModelConfig(
    **TINY, num_layers=3, num_experts=5, experts_per_token=3, expert_d_ff=8, shared_experts=2, dense_layers_first=1,
    kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, name="tiny-deepseek",
)  # fmt: skip
DEEPSEEK_LITE = dataclasses.replace(DEEPSEEK, q_lora_rank=None, shared_experts=1, name="tiny-deepseek-lite")
CONFIGS = [MIXTRAL, QWEN3_MOE, DEEPSEEK, DEEPSEEK_LITE]
# DeepSeek's MoE (shared experts, a dense first block) with attention without MLA, which the replay lacks
TINY_DEEPSEEK_MHA = ModelConfig(
    **TINY, num_layers=3, num_kv_heads=2, num_experts=4, experts_per_token=3, expert_d_ff=8, shared_experts=2,
    dense_layers_first=1, name="tiny-deepseek-mha",
)  # fmt: skip


def _live(cfg):
    from lm_accounting.model import build_model

    return [(n, tuple(p.shape)) for n, p in build_model(cfg, "meta").named_parameters()]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_parameter_shapes_are_the_live_models(cfg):
    """Names, shapes and order equal ``named_parameters()`` of the live model built on meta."""
    pytest.importorskip("torch")
    assert [(p.name, p.shape) for p in parameter_shapes(cfg)] == _live(cfg)


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "openai-gpt2", "llama-3-8b"])
def test_parameter_shapes_of_the_presets(preset):
    """The presets' whole layer patterns (DeepSeek's 3 dense blocks first), on 4-layer meta builds; and
    the other architecture options (GPT-2: learned positions, LayerNorm, biases, GELU MLP, tied)."""
    pytest.importorskip("torch")
    cfg = dataclasses.replace(load_config(preset), num_layers=4)
    assert [(p.name, p.shape) for p in parameter_shapes(cfg)] == _live(cfg)


def test_expert_stacks_by_hand():
    # Mixtral-8x7B: each MoE block holds w1, w3 (8, 14336, 4096) and w2 (8, 4096, 14336), and the
    # router (8, 4096).
    shapes = {p.name: p.shape for p in parameter_shapes(load_config("mixtral-8x7b"))}
    assert shapes["layers.31.moe.experts.w1.weight"] == (8, 14336, 4096)
    assert shapes["layers.31.moe.experts.w2.weight"] == (8, 4096, 14336)
    assert shapes["layers.0.moe.router.weight"] == (8, 4096)
    # DeepSeek-V3: kv_b_proj (128·(128 + 128), 512), kv_a_proj (512 + 64, 7168), one shared expert
    # of 2048; blocks 0-2 dense (ffn.w1 (18432, 7168)), 3-60 MoE.
    shapes = {p.name: p.shape for p in parameter_shapes(load_config("deepseek-v3"))}
    assert shapes["layers.5.attn.kv_b_proj.weight"] == (32768, 512)
    assert shapes["layers.5.attn.kv_a_proj.weight"] == (576, 7168)
    assert shapes["layers.5.moe.shared.w1.weight"] == (2048, 7168)
    assert shapes["layers.2.ffn.w1.weight"] == (18432, 7168) and "layers.3.ffn.w1.weight" not in shapes


def test_pipeline_stages_keep_every_parameter_once():
    """Stage 0 starts with the embedding, the last stage ends with the final norm and the (tied: a
    second copy of the) LM head; the blocks are split 2 + 1."""
    first, last = stage_parameters(QWEN3_MOE, 2, 0), stage_parameters(QWEN3_MOE, 2, 1)
    assert first[0].name == "token_embeddings.weight" and {p.unit for p in first[1:]} == {1, 2}
    assert [p.name for p in last[-2:]] == ["ln_final.weight", "lm_head.weight"] and {p.unit for p in last[:-2]} == {3}


# -- data parallel (DDP, ZeRO-1, FSDP2) on the fake process group --------------------------------
S = 16  # S·k = 32 slots: a multiple of E = 4 (Mixtral-like), so the MoE step replay is exact in B
DP = {z: ParallelLayout(dp=4, zero=z) for z in (0, 1, 2, 3)}


def test_fsdp_shards_of_a_mixture_of_experts_by_hand():
    """Tiny Mixtral over dp = 4, FSDP2, fp32: dim-0 chunks ceil(rows / 4).  Per block: ln1, ln2 24 -> 6
    each; q, o (24, 24) -> 6·24 = 144 each; k, v (12, 24) -> 3·24 = 72 each; router (4, 24) -> 24; each
    expert stack (4, 40, 24) or (4, 24, 40) -> one expert, 960: 2·6 + 2·144 + 2·72 + 24 + 3·960 = 3,348.
    Root: embedding and LM head (101, 24) -> 26·24 = 624 each, ln_final 6.  2·3,348 + 1,254 = 7,950."""
    st = model_states(MIXTRAL, TrainingSetup(), DP[3])
    assert st.parameters == st.gradients == 7_950 * 4 and st.optimizer == 2 * 7_950 * 4
    # rank 3: the embedding and the LM head hold 101 − 78 = 23 rows: 2·(26 − 23)·24 = 144 elements fewer
    assert model_states(MIXTRAL, TrainingSetup(), DP[3], rank=3).optimizer == 2 * (7_950 - 144) * 4
    # the largest unit is a block, all-gathered whole: 3,348·4 elements (the root: 1,254·4)
    assert st.unsharded_unit_max == 3_348 * 4 * 4 and st.unsharded_all == 7_950 * 4 * 4


def test_fsdp_units_of_unequal_blocks_by_hand():
    """Tiny DeepSeek over dp = 4, FSDP2, fp32: block 0 is dense, blocks 1-2 MoE; the largest unit is an
    MoE block.  Per block, every tensor padded to 4 chunks: ln1, ln2 24·2; q_a (12, 24) 12·24; q_a_norm
    12; q_b (4·10, 12) 40·12; kv_a (20, 24) 20·24; kv_a_norm 16; kv_b (4·11, 16) 44·16; output (24, 20)
    24·20.  Dense FFN: w1, w3 (40, 24), w2 (24, 40): 3·960.  MoE: router (5, 24) -> 8·24; 3 expert
    stacks of 5 experts -> 8 (chunk 2) × 8·24 each; shared (16, 24), (24, 16), (16, 24): 3·384."""
    attn = 48 + 288 + 12 + 480 + 480 + 16 + 704 + 480
    dense, moe = attn + 3 * 960, attn + 8 * 24 + 3 * 8 * 192 + 3 * 384
    root = 2 * 104 * 24 + 24
    st = model_states(DEEPSEEK, TrainingSetup(), DP[3])
    assert st.unsharded_all == (root + dense + 2 * moe) * 4 and st.unsharded_unit_max == moe * 4
    # rank 3 holds no expert (rows 6-7 of the padded 8) and 23 embedding and LM head rows
    owned3 = (root + dense + 2 * moe) // 4 - 2 * 3 * 24 - 2 * (8 * 24 + 3 * 8 * 192) // 4
    assert model_states(DEEPSEEK, TrainingSetup(), DP[3], rank=3).owned_elements == owned3


@pytest.mark.grid
@pytest.mark.parametrize("zero", DP)
@pytest.mark.parametrize("cfg", [MIXTRAL, QWEN3_MOE, DEEPSEEK], ids=lambda c: c.name)
def test_states_and_collectives_equal_the_fake_pg_run(cfg, zero):
    """Every rank's parameters, gradients and AdamW state (uneven shards: 6 and 5 experts and 101 rows over
    4 ranks; ZeRO-1's whole-tensor partition) and every collective of the first step, byte for byte."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    setup, lay = TrainingSetup(), DP[zero]
    for rank in (0, 3):
        m = measure_rank(cfg, S, 1, setup, lay, rank=rank)
        st = model_states(cfg, setup, lay, rank=rank)
        assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer)
        assert m.collectives == totals(step_collectives(cfg, S, 1, setup, lay, first_step=True))


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [MIXTRAL, DEEPSEEK], ids=lambda c: c.name)
def test_fsdp_mixed_precision_states_and_collectives(cfg):
    """amp-bf16 under FSDP2 (bf16 all-gathers, fp32 reduce-scatters) with full checkpointing."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    setup = TrainingSetup(checkpoint="full", precision="amp-bf16")
    m = measure_rank(cfg, S, 1, setup, DP[3])
    st = model_states(cfg, setup, DP[3])
    assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer)
    assert m.collectives == totals(step_collectives(cfg, S, 1, setup, DP[3], first_step=True))


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(), TrainingSetup(checkpoint="full", precision="amp-bf16"), TrainingSetup(checkpoint="selective")],
    ids=lambda s: s.label,
)
def test_moe_ddp_and_zero1_steps_are_exact(setup, zero):
    """A mixture of experts is replayed exactly on one GPU, so DDP's and ZeRO-1's every phase (peaks
    included) equal the fake-PG run byte for byte, on the first and the last rank."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    for rank in (0, 3):
        m = measure_rank(MIXTRAL, S, 1, setup, DP[zero], rank=rank)
        assert m.step == rank_step(MIXTRAL, S, 1, setup, DP[zero], mode="traced", rank=rank)[0]
        r = parallel_memory(MIXTRAL, S, 1, setup, DP[zero], rank=rank)
        assert r.not_modelled == () and r.peaks_exact and r.step.peak >= r.states.total


@pytest.mark.slow
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize(
    "setup", [TrainingSetup(), TrainingSetup(checkpoint="selective", precision="bf16")], ids=lambda s: s.label
)
def test_moe_fsdp_steps_are_exact_without_mixed_precision(setup, zero):
    """FSDP2's unit events around the MoE blocks (``analytic.fsdp``) with the MoE replay: every phase
    byte for byte on the first and the last rank (amp-bf16: ``test_moe_fsdp_mixed_precision_steps_are_exact``)."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    for rank in (0, 3):
        m = measure_rank(MIXTRAL, S, 1, setup, DP[zero], rank=rank)
        assert m.step == rank_step(MIXTRAL, S, 1, setup, DP[zero], mode="traced", rank=rank)[0]


CHECKPOINTS = ("none", "full", "selective")


def _amp(attention, checkpoint):
    return TrainingSetup(attention=attention, checkpoint=checkpoint, precision="amp-bf16")


AMP_GRID = [  # the three MoE patterns × dp 2, 4 × zero 2, 3 × naive, sdpa × none, full, selective × B 1, 2
    (cfg, ParallelLayout(dp=dp, zero=zero), _amp(a, c), b)
    for cfg, dp, zero, a, c, b in itertools.product(
        (MIXTRAL, QWEN3_MOE, TINY_DEEPSEEK_MHA), (2, 4), (2, 3), ("naive", "sdpa"), CHECKPOINTS, (1, 2)
    )
]
AMP_CASES = [  # the default run's subset: every config, dp, zero, attention, checkpoint and B at least once
    (MIXTRAL, ParallelLayout(dp=4, zero=3), _amp("naive", "none"), 1),
    (MIXTRAL, ParallelLayout(dp=2, zero=2), _amp("sdpa", "selective"), 2),
    (MIXTRAL, ParallelLayout(dp=4, zero=2), _amp("naive", "full"), 2),
    (QWEN3_MOE, ParallelLayout(dp=4, zero=3), _amp("sdpa", "full"), 1),  # S·k = 32 slots over 6 experts
    (QWEN3_MOE, ParallelLayout(dp=2, zero=3), _amp("naive", "selective"), 2),
    (TINY_DEEPSEEK_MHA, ParallelLayout(dp=4, zero=3), _amp("naive", "selective"), 1),  # shared experts
    (TINY_DEEPSEEK_MHA, ParallelLayout(dp=2, zero=2), _amp("sdpa", "none"), 2),
]
_AMP_IDS = dict(ids=lambda x: getattr(x, "label", getattr(x, "name", None)) if not isinstance(x, int) else f"B{x}")


def _assert_amp_step_exact(cfg, lay, setup, batch):
    from lm_accounting.measure.distributed import measure_rank

    for rank in (0, lay.dp - 1):
        m = measure_rank(cfg, S, batch, setup, lay, rank=rank)
        step, _, saved = rank_step(cfg, S, batch, setup, lay, mode="traced", rank=rank)
        assert m.step == step, rank
        assert lay.zero == 2 or m.step.forward.end - m.step.baseline == saved, rank


@pytest.mark.slow
@pytest.mark.parametrize(("cfg", "lay", "setup", "batch"), AMP_CASES, **_AMP_IDS)
def test_moe_fsdp_mixed_precision_steps_are_exact(cfg, lay, setup, batch):
    """FSDP2's MixedPrecisionPolicy(bf16) under amp-bf16: the forward sees bf16 parameters under autocast,
    so the router's exp, Σ and top-k weights and the weighted sum are fp32, and the sum is cast back to
    the input's bf16 (model/moe.py, as transformers' Mixtral and Qwen3-MoE blocks return the hidden
    dtype): the residual stream stays bf16 (``replay._moe_mixed``).  Every phase's peak and end byte for
    byte against the fake-PG job on the first and the last rank; under zero 3 the forward ends on the
    saved activations alone.  ``memory`` calls the peaks exact and models everything."""
    pytest.importorskip("torch")
    _assert_amp_step_exact(cfg, lay, setup, batch)
    r = parallel_memory(cfg, S, batch, setup, lay)
    assert r.not_modelled == () and r.peaks_exact


@pytest.mark.grid
@pytest.mark.parametrize(("cfg", "lay", "setup", "batch"), AMP_GRID, **_AMP_IDS)
def test_moe_fsdp_mixed_precision_grid_is_exact(cfg, lay, setup, batch):
    """The whole grid (144 jobs, 288 ranks measured) of ``test_moe_fsdp_mixed_precision_steps_are_exact``."""
    pytest.importorskip("torch")
    _assert_amp_step_exact(cfg, lay, setup, batch)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cfg", "lay", "setup", "batch"),
    [
        (MIXTRAL, ParallelLayout(dp=4, zero=3), _amp("naive", "none"), 1),
        (TINY_DEEPSEEK_MHA, ParallelLayout(dp=2, zero=2), _amp("sdpa", "full"), 2),
    ],
    **_AMP_IDS,
)
def test_moe_fsdp_mixed_precision_plain_run_equals_the_cpu_allocator(cfg, lay, setup, batch):
    """The plain run (no dispatch mode) of the first and the last rank against the CPU allocator's own
    events, whose CPU-only extras include the fp32 copy of the bf16 routed outputs that the CPU's
    bf16 · fp32 products make (forward and backward; a GPU casts inside the kernel)."""
    torch = pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank_plain

    for rank in (0, lay.dp - 1):
        measured = measure_rank_plain(cfg, S, batch, setup, lay, rank=rank)
        predicted = rank_step(cfg, S, batch, setup, lay, "plain", rank, "cpu", torch.get_num_threads())[0]
        assert measured == predicted, rank


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_a_moe_split_that_varies_with_the_batch_is_exact_per_micro_batch(zero):
    """QWEN3_MOE at S = 16: S·k = 32 slots over 6 experts, no lines in B (2 left over at B = 1, none at
    B = 3), so the layout gave no peak there (single-GPU memory and sweep did).  One micro-batch is one
    replay: every phase equals the fake-PG run, first and last rank, both splits."""
    pytest.importorskip("torch")
    from lm_accounting.analytic.replay import moe_lines_in_batch
    from lm_accounting.measure.distributed import measure_rank

    assert not moe_lines_in_batch(QWEN3_MOE, S)
    setup = TrainingSetup(attention="sdpa", checkpoint="full") if zero % 2 else TrainingSetup(precision="bf16")
    for batch, rank in ((1, 0), (3, 3)):
        m = measure_rank(QWEN3_MOE, S, batch, setup, DP[zero], rank=rank)
        assert m.step == rank_step(QWEN3_MOE, S, batch, setup, DP[zero], mode="traced", rank=rank)[0]
        r = parallel_memory(QWEN3_MOE, S, batch, setup, DP[zero], rank=rank)
        assert r.not_modelled == () and r.peaks_exact and r.step_traced == m.step


def test_a_moe_split_that_varies_with_the_batch_is_planned_and_agrees_with_memory(run_cli):
    """qwen3-30b-a3b at S = 1,000 (8,000 slots over 128 experts): memory with --dp 1 gives the single-GPU
    step peak (naive fp32: the same kernels), and plan ranks layouts instead of refusing."""
    one = json.loads(run_cli("memory", "qwen3-30b-a3b", "-S", "1000", "--format", "json").out)
    dp1 = json.loads(run_cli("memory", "qwen3-30b-a3b", "-S", "1000", "--dp", "1", "--format", "json").out)
    assert dp1["not_modelled"] == [] and dp1["peak"] == one["implementation_exact"]["step"]["peak"]
    r = run_cli("plan", "qwen3-30b-a3b", "-S", "1000", "--global-batch-tokens", "1024000", "--tokens", "1e12",
                "--gpus", "64..128", "--top", "1")  # fmt: skip
    assert r.code == 0 and "Best 1 layout by GPU-hours" in r.out, r.err


@pytest.mark.parametrize(
    ("cfg", "setup", "missing"),
    [
        (DEEPSEEK, TrainingSetup(), "latent attention (MLA)"),
    ],
    ids=["mla"],
)
def test_what_the_replay_does_not_model_is_said_not_made_up(cfg, setup, missing):
    """Model states and collectives are given; activations, phases and peaks are None, and say why."""
    r = parallel_memory(cfg, S, 1, setup, DP[3])
    assert any(missing in m for m in r.not_modelled), r.not_modelled
    assert r.step is None and r.activations is None and r.peak is None and r.fits is None
    d = r.to_dict()
    assert d["step"] is None and d["peak"] is None and d["per_gpu"]["parameters"] == r.states.parameters
    assert d["collectives"] and not r.peaks_exact


@pytest.mark.parametrize("preset", ["deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_cli_memory_with_a_layout_for_the_moe_presets(run_cli, preset):
    r = run_cli("memory", preset, "--context", "4096", "--dp", "8", "--zero", "3", "--format", "json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    lay = ParallelLayout(dp=8, zero=3)
    assert (
        d["per_gpu"]["parameters"]
        == model_states(load_config(preset).with_context(4096), TrainingSetup(), lay).parameters
    )
    assert d["not_modelled"] == ([] if preset == "mixtral-8x7b" else d["not_modelled"])


# -- expert parallel --------------------------------------------------------------------------------
def test_expert_parallel_shards_by_hand():
    """Tiny Mixtral (E = 4) over dp = 8 with ep = 2 (FSDP2 zero 3, fp32).  Each rank keeps E/ep = 2
    experts; the expert stacks are sharded over dp/ep = 4 ranks, on dim 1 since dp > E (torchtitan):
    w1, w3 (2, 40, 24) -> (2, 10, 24) = 480; w2 (2, 24, 40) -> (2, 6, 40) = 480.  The rest over dp = 8:
    per block ln1, ln2 3 each, q and o 3·24 = 72 each, k and v 2·24 = 48 each, router 1·24 = 24: 270;
    root: embedding and LM head ceil(101/8) = 13 rows -> 312 each, ln_final 3: 627.
    627 + 2·(270 + 3·480) = 4,047 elements."""
    lay = ParallelLayout(dp=8, zero=3, ep=2)
    st = model_states(MIXTRAL, TrainingSetup(), lay)
    assert st.parameters == 4_047 * 4
    # the expert units, gathered over 4 ranks: 2 blocks × 4 × 1,440 elements
    assert st.unsharded_experts == 2 * 4 * 1_440 * 4
    # without expert parallel each rank stores a padded chunk of one whole expert per stack: 3·960 per block
    assert (
        model_states(MIXTRAL, TrainingSetup(), ParallelLayout(dp=8, zero=3)).parameters == (627 + 2 * (270 + 2_880)) * 4
    )


def test_expert_rows_and_all_to_alls_by_hand():
    """Tiny Qwen3-MoE (E = 6, k = 2) at S = 16: T·k = 32 slots per rank, c_e = 6 for experts 0, 1 and 5 for
    2-5.  ep = 3: ep rank 0 (experts 0, 1) receives 6 + 6 rows from each of 3 ranks: 36; ep ranks 1 and 2
    (experts 2, 3 and 4, 5): 5 + 5 from each, 30.  Each all-to-all moves max(32, R) rows of d = 24 fp32: 3,456 bytes on rank 0 and
    32·24·4 = 3,072 on rank 5; the one MoE layer runs 2 in forward and 2 in backward."""
    lay = ParallelLayout(dp=6, zero=3, ep=3)
    assert [expert_rows(QWEN3_MOE, S, 1, lay, r) for r in range(6)] == [36, 30, 30, 36, 30, 30]
    for rank, payload in ((0, 3_456), (5, 3_072)):
        a2a = [c for c in step_collectives(QWEN3_MOE, S, 1, TrainingSetup(), lay, rank=rank) if c.kind == "all_to_all"]
        assert [(c.phase, c.count, c.payload) for c in a2a] == [
            ("forward", 2, 2 * payload),
            ("backward", 2, 2 * payload),
        ]
    # rank 0's experts run 36 rows instead of 32: 3 matrices × 2·4·24·12 more FLOPs per forward
    extra = (
        rank_flops(QWEN3_MOE, S, 1, TrainingSetup(), lay, 0).forward
        - rank_flops(QWEN3_MOE, S, 1, TrainingSetup(), ParallelLayout(dp=6, zero=3)).forward
    )
    assert extra == 3 * 2 * 4 * 24 * 12


EP_CASES = [
    (MIXTRAL, ParallelLayout(dp=4, zero=3, ep=2), TrainingSetup()),
    (MIXTRAL, ParallelLayout(dp=4, zero=2, ep=4), TrainingSetup()),  # dp/ep = 1: no expert all-gathers
    (MIXTRAL, ParallelLayout(dp=8, zero=3, ep=2), TrainingSetup()),  # dp > E: experts sharded on dim 1
    (MIXTRAL, ParallelLayout(dp=4, zero=3, ep=2), TrainingSetup(checkpoint="full", precision="amp-bf16")),
    (
        MIXTRAL,
        ParallelLayout(dp=4, zero=3, ep=2),
        TrainingSetup(attention="sdpa", checkpoint="selective", precision="bf16"),
    ),
    (QWEN3_MOE, ParallelLayout(dp=6, zero=3, ep=3), TrainingSetup(checkpoint="full")),  # uneven rows and shards
    (DEEPSEEK, ParallelLayout(dp=5, zero=3, ep=5), TrainingSetup(checkpoint="full", precision="amp-bf16")),
]


@pytest.mark.grid
@pytest.mark.parametrize(("cfg", "lay", "setup"), EP_CASES, ids=lambda x: getattr(x, "label", getattr(x, "name", None)))
def test_expert_parallel_equals_the_fake_pg_run(cfg, lay, setup):
    """The EP job on the fake process group (each rank's E/ep experts, all_to_all_single dispatch and
    combine, the experts' own FSDP2 unit over dp/ep): the first and the last rank's model states, every
    collective (all-to-alls included) and the local matmul FLOPs (the rows its experts ran), exact."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    for rank in (0, lay.world - 1):
        m = measure_rank(cfg, S, 1, setup, lay, rank=rank)
        st = model_states(cfg, setup, lay, rank=rank)
        assert (m.params, m.gradients, m.optimizer) == (st.parameters, st.gradients, st.optimizer)
        assert m.collectives == totals(step_collectives(cfg, S, 1, setup, lay, first_step=True, rank=rank))
        assert m.local_flops == rank_flops(cfg, S, 1, setup, lay, rank).hardware


def test_expert_parallel_reports_states_and_a_modelled_step():
    """fp32 and amp-bf16: the step is replayed (every phase, ``test_expert_parallel_steps_equal_the_fake_pg_run``),
    nothing is left out and the peaks are exact."""
    lay = ParallelLayout(dp=4, zero=3, ep=2)
    r = parallel_memory(MIXTRAL, S, 1, TrainingSetup(), lay)
    assert r.not_modelled == () and r.peaks_exact and r.step.peak >= r.states.total
    assert r.experts() == {"local_experts": 2, "slots_per_moe_layer": 32, "rows_per_moe_layer": 32}
    amp = parallel_memory(MIXTRAL, S, 1, TrainingSetup(precision="amp-bf16"), lay)
    assert amp.not_modelled == () and amp.peaks_exact and amp.step.peak >= amp.states.total


def test_expert_parallel_split_by_hand():
    """Tiny Qwen3-MoE's T·k = 32 slots over E = 6 (q = 5, 32 mod 6 = 2: experts 0 and 1 get 6, 2-5 get 5)
    at ep = 2 (G = 3).  ep rank 0 (experts 0-2) is sent 6 + 6 + 5 = 17 rows by each rank and receives
    2·17 = 34: a batched part of 2·5 = 10 rows per expert, and 2 more (one per source) for each of its
    2 experts with 6; ep rank 1 (experts 3-5) receives 2·15 = 30, batched only (no extra expert)."""
    assert expert_parallel_split(32, 6, 2, 0) == ExpertParallelSplit((17, 15), 34, 10, 2)
    assert expert_parallel_split(32, 6, 2, 1) == ExpertParallelSplit((17, 15), 30, 10, 0)
    plan = expert_parallel_plan(32, 6, 2, 0)  # the live model's index lists: its counts are the same
    assert (plan.sent, plan.received, plan.full_rows, plan.extra_experts) == ([17, 15], [17, 17], 10, 2)
    assert sorted(plan.local_order) == list(range(34)) and sorted(plan.by_expert) == list(range(32))


def test_expert_unit_buffers_by_hand():
    """Tiny Mixtral, dp = 4, ep = 2, FSDP2, fp32.  The MoE block's unit without its experts: ln1, ln2 24
    each, q, o 24·24, k, v 12·24, router 4·24: 1,872 elements, 7,488 bytes gathered.  The experts' unit: 2
    local experts × (w1, w3 (40, 24), w2 (24, 40)) = 2·3·960 = 5,760 elements, 23,040 bytes, over dp/ep = 2
    ranks: a shard of 1 expert per stack, 11,520 bytes; the last parameter, w3, 2·40·24·4 = 7,680.  At
    dp = ep = 4 the experts' mesh has one rank: no all-gather output (``Unit.output`` 0)."""
    units = fsdp_units(MIXTRAL, TrainingSetup(), ParallelLayout(dp=4, zero=3, ep=2))
    assert [u.gathered for u in units.blocks] == [7_488] and units.kinds == (0,) * MIXTRAL.num_layers  # no dense
    assert units.experts == Unit(23_040, 0, 23_040, 7_680, 23_040, 11_520, 0, 7_680)
    assert units.experts.output == 23_040
    alone = fsdp_units(MIXTRAL, TrainingSetup(), ParallelLayout(dp=4, zero=3, ep=4)).experts
    assert alone.gathered == 11_520 and alone.output == 0 and alone.last_grad == 0
    # dp = 8 > E = 4: the stacks sharded on dim 1 over dp/ep = 4 ranks (w1 (2, 40, 24): 10 of the 40 rows
    # of every expert); the copy-out goes through one temporary per stack, 2·40·24·4 = 7,680 each
    dim1 = fsdp_units(MIXTRAL, TrainingSetup(), ParallelLayout(dp=8, zero=3, ep=2)).experts
    assert dim1.gathered == dim1.dim1 == 3 * 7_680 and dim1.reduce_out == 3 * 7_680 // 4


def _setup(attention, checkpoint, precision):
    return TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)


EP_STEP_CASES = [
    (MIXTRAL, S, 1, ParallelLayout(dp=2, zero=3, ep=2), _setup("naive", "none", "fp32")),
    (MIXTRAL, S, 2, ParallelLayout(dp=4, zero=3, ep=2), _setup("sdpa", "selective", "bf16")),
    (MIXTRAL, S, 1, ParallelLayout(dp=4, zero=2, ep=4), _setup("naive", "full", "fp32")),  # one-rank expert mesh
    # 30 slots over 4 experts: 8, 8, 7, 7; ep rank 0's expert runs two parts, ep rank 3's one
    (MIXTRAL, 15, 1, ParallelLayout(dp=4, zero=3, ep=4), _setup("naive", "full", "bf16")),
    (QWEN3_MOE, S, 1, ParallelLayout(dp=2, zero=3, ep=2), _setup("sdpa", "full", "fp32")),  # rank 0: two parts
    (QWEN3_MOE, S, 2, ParallelLayout(dp=4, zero=2, ep=2), _setup("naive", "selective", "bf16")),
    (TINY_DEEPSEEK_MHA, S, 2, ParallelLayout(dp=4, zero=3, ep=2), _setup("naive", "selective", "fp32")),
    (TINY_DEEPSEEK_MHA, S, 1, ParallelLayout(dp=2, zero=2, ep=2), _setup("sdpa", "none", "bf16")),
    (TINY_DEEPSEEK_MHA, S, 1, ParallelLayout(dp=4, zero=3, ep=4), _setup("sdpa", "full", "fp32")),
    (MIXTRAL, S, 2, ParallelLayout(dp=8, zero=3, ep=2), _setup("sdpa", "full", "fp32")),  # dp > E: dim-1 shards
    (QWEN3_MOE, S, 1, ParallelLayout(dp=8, zero=2, ep=2), _setup("naive", "selective", "bf16")),
    # amp-bf16: FSDP2's bf16 parameters, the routing and the weighted sum in fp32 (``replay._moe_mixed``)
    (MIXTRAL, S, 1, ParallelLayout(dp=2, zero=3, ep=2), _setup("naive", "none", "amp-bf16")),
    (MIXTRAL, 15, 2, ParallelLayout(dp=4, zero=2, ep=4), _setup("sdpa", "full", "amp-bf16")),
    (QWEN3_MOE, S, 2, ParallelLayout(dp=4, zero=3, ep=2), _setup("naive", "selective", "amp-bf16")),
    (TINY_DEEPSEEK_MHA, S, 1, ParallelLayout(dp=8, zero=3, ep=2), _setup("sdpa", "none", "amp-bf16")),
]


@pytest.mark.grid
@pytest.mark.parametrize(
    ("cfg", "seq", "batch", "lay", "setup"),
    EP_STEP_CASES,
    ids=lambda x: getattr(x, "label", getattr(x, "name", None)) if not isinstance(x, int) else f"{x}",
)
def test_expert_parallel_steps_equal_the_fake_pg_run(cfg, seq, batch, lay, setup):
    """The EP rank's own step replayed (``replay._ep_routed_forward``/``_ep_routed_backward``: the slots
    sorted for the dispatch all-to-all, the received rows in local expert order, the experts' one or two
    parts, the combine all-to-all and the slot order again, and the experts' own FSDP2 unit over dp/ep,
    on dim 1 when dp > E, ``analytic.fsdp`` rule 7) against the fake-PG job: every phase's peak and end,
    byte for byte, on the first rank and the last (another ep rank, with other row counts when T·k is not
    a multiple of E).
    Under zero 3 (everything resharded) the measured forward ends on the saved activations alone, which
    the reported figure equals (``expert_parallel_saved_shift``)."""
    pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank

    for rank in (0, lay.dp - 1):
        m = measure_rank(cfg, seq, batch, setup, lay, rank=rank)
        step, _, saved = rank_step(cfg, seq, batch, setup, lay, mode="traced", rank=rank)
        assert m.step == step, rank
        assert lay.zero == 2 or m.step.forward.end - m.step.baseline == saved, rank


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cfg", "lay", "setup", "batch"),
    [
        (MIXTRAL, ParallelLayout(dp=4, zero=3, ep=2), _setup("naive", "full", "fp32"), 1),
        (QWEN3_MOE, ParallelLayout(dp=2, zero=2, ep=2), _setup("sdpa", "none", "bf16"), 2),
        (MIXTRAL, ParallelLayout(dp=4, zero=3, ep=2), _setup("naive", "none", "amp-bf16"), 1),
    ],
    ids=["mixtral-full", "qwen3-uneven", "mixtral-amp"],
)
def test_expert_parallel_plain_run_equals_the_cpu_allocator(cfg, lay, setup, batch):
    """The plain run (no dispatch mode) of the EP rank against the CPU allocator's own events: besides the
    traced run's tensors, the dispatch's int64 indices (``torch.tensor`` of the plan's lists: T·k·8 and
    R·8 bytes each, unseen by a dispatch mode) and a naive rerun's wrapped 1/√d_head held to its early
    stop, which the rerun's dispatch peak includes."""
    torch = pytest.importorskip("torch")
    from lm_accounting.measure.distributed import measure_rank_plain

    for rank in (0, lay.dp - 1):
        measured = measure_rank_plain(cfg, S, batch, setup, lay, rank=rank)
        predicted = rank_step(cfg, S, batch, setup, lay, "plain", rank, "cpu", torch.get_num_threads())[0]
        assert measured == predicted, rank


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dp", "6", "--zero", "3", "--ep", "3"], "ep=3 does not divide the 8 experts"),
        (["--dp", "8", "--zero", "3", "--ep", "3"], "ep=3 does not divide dp=8"),
        (["--dp", "8", "--zero", "1", "--ep", "2"], "needs FSDP2"),
    ],
)
def test_cli_bad_expert_parallel_exits_2_with_one_line(run_cli, args, message):
    r = run_cli("memory", "mixtral-8x7b", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_expert_parallel_on_a_dense_model_is_refused(run_cli):
    r = run_cli("memory", "llama-3-8b", "--dp", "8", "--zero", "3", "--ep", "2")
    assert r.code == 2 and "needs a mixture of experts" in r.err


def test_cli_expert_parallel_json(run_cli):
    r = run_cli(
        "memory", "qwen3-30b-a3b", "--context", "4096", "--dp", "16", "--zero", "3", "--ep", "8", "--format", "json"
    )
    assert r.code == 0, r.err
    d = json.loads(r.out)
    # 128 experts / 8 = 16 per rank; T·k = 4,096·8 = 32,768 slots, and 128 divides them: 32,768 rows
    assert d["experts"] == {"local_experts": 16, "slots_per_moe_layer": 32_768, "rows_per_moe_layer": 32_768}
    a2a = [c for c in d["collectives"] if c["kind"] == "all_to_all"]
    # 48 MoE layers × (dispatch + combine) of 32,768 × 2,048 fp32 = 268,435,456 bytes each; ring: 7/8 leaves the rank
    assert [(c["phase"], c["count"], c["payload_bytes"], c["wire_bytes"]) for c in a2a] == [
        ("forward", 96, 96 * 268_435_456, 96 * 268_435_456 * 7 // 8),
        ("backward", 96, 96 * 268_435_456, 96 * 268_435_456 * 7 // 8),
    ]


# -- plan ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_plan_enumerates_data_and_expert_parallel_layouts_for_a_mixture_of_experts():
    """tp = pp = 1; expert parallel under FSDP2 (amp-bf16 is replayed, EP included): every ranked peak is
    exact, not an estimate."""
    from lm_accounting.plan import plan

    p = plan(load_config("qwen3-30b-a3b"), "h100-80gb", (8, 128), 4096, 4096 * 1024, 10**12, top=10**6)
    assert p.ranked and all(c.layout.tp == c.layout.pp == 1 for c in p.ranked)
    assert {c.layout.ep > 1 for c in p.ranked} == {True, False} and all(c.peak_exact for c in p.ranked)


@pytest.mark.slow
def test_plan_fits_mixtral_only_with_expert_parallel_and_says_why():
    """Mixtral's 8 experts: FSDP2's dim-0 chunks hold at least one whole expert per rank whatever dp, so
    with fp32 states every layout without expert parallel needs more than 80 GB (32 layers × 3 ×
    14,336·4,096 × 16 bytes ≈ 90 GB); expert parallel shards the experts over dp/ep ranks again, so on
    16 GPUs or more every layout that fits has ep > 1.  On 8 GPUs nothing fits, and the refusal says why."""
    from lm_accounting.plan import plan

    p = plan(load_config("mixtral-8x7b"), "h100-80gb", (8, 1024), 4096, 4096 * 1024, 10**12, top=10**6)
    assert p.ranked and all(c.layout.ep > 1 and c.peak_exact for c in p.ranked)
    with pytest.raises(AccountingError, match="dim-0 shards of the 8-expert stacks stop shrinking past dp = 8") as e:
        plan(load_config("mixtral-8x7b"), "h100-80gb", (8, 8), 4096, 4096 * 1024, 10**12)
    assert "not planned" not in str(e.value)  # expert parallel was evaluated
    assert 32 * 3 * 14_336 * 4_096 * 16 > 80 * 10**9


def test_plan_refuses_latent_attention_in_one_line(run_cli):
    r = run_cli("plan", "deepseek-v3", "--tokens", "1000000000000", "--context", "4096")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "does not model" in r.err
