"""FSDP2 over transformers' patterned hybrids (issue 26): one rank of ``fully_shard`` on every decoder layer, then
the root (``analytic.ops.fsdp.FullyShard``), replayed without torch, equals transformers' own model sharded on torch's
fake process group and measured by the rank tracker (``measure.hf_parallel.measure_hf_rank`` through
``measure.hf.measure_hf_step(..., layout=...)``), phase by phase, byte for byte (tests/test_ops_fsdp.py's method).

The hybrids' layers have unlike parameter sets: Nemotron-H's Mamba2 (M), attention (*) and squared-ReLU MLP (-)
blocks; Bamba's and Granite-4.0-H's Mamba2 or attention mixers in Llama's block; Qwen3-Next's and Qwen3.5's Gated
DeltaNet or gated full attention, with dense and sparse blocks alternating (``decoder_sparse_step`` 2).  Each distinct
block is its own FSDP2 unit (``analytic.fsdp.FsdpUnits``), and a run of alike layers replayed once is cut where the
units before or after it differ (``ops.tensors.split_runs``).  fp32, bf16 and amp-bf16 (the bf16
``MixedPrecisionPolicy`` over the fp32 model: ``ops.fsdp.POLICY_EXACT``), ZeRO-2 and ZeRO-3, world 2 to 8 (3, 5, 6
and 7 pad every dim 0 of the tiny shapes that they do not divide).  Mixtures of experts in bf16 and amp-bf16 only:
transformers' grouped_mm experts have a bf16-only FakeTensor kernel (``measure.hf.check_grouped_mm``).  Falcon-H1
(every layer alike) too: under the policy its ``mup_vector`` buffers stay fp32 (``falcon_h1.causal_lm``'s
``buffer_dtype``), and their product promotes the mixer's projections to fp32 (built in bf16, the replay was 888 B
below the job's baseline at world 4, and 40-48 KB below its forward peak).

The configs are the tiny config.json objects of tests/test_ops_transformers_mamba2.py and
tests/test_ops_transformers_gdn.py.

Falcon-H1 with ``mamba_rms_norm`` (``FalconH1RMSNormGated``, ``falcon_h1.RMSNormGated``), the gate multiplied after
the norm (``mamba_norm_before_gate``, the class's default) or before it, against ``FalconH1ForCausalLM`` on meta at
B = 1, 2 and 3 (``test_ops_transformers_llama.check``), its plain CPU run against the CPU allocator
(``test_ops_transformers_zoo.check_plain``), and under FSDP2 on the fake process group.  The two orders
give the same phase figures at some shapes (fp32 at the tiny widths) and not at others: the bf16 cases below differ
in their backward peak (the order of the fp32 temporaries), so each order is proven where it shows."""

import json

import pytest

from lm_accounting.analytic.ops import predict_step
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
import test_ops_transformers_gdn as gdn
from test_ops_transformers_mamba2 import EXPERTS, NEMOTRON_H, bamba, falcon_h1, granite_h, tiny

from lm_accounting.measure.hf import measure_hf_step

MODELS = {
    "nemotron_h": lambda: tiny("M*-M"),
    # runs of three Mamba2 layers after and before other units: cut where FSDP2's neighbours differ
    "nemotron_h-long": lambda: tiny("MMMM*MMM-M"),
    "bamba": lambda: bamba("M*MM"),
    "bamba-attention-first": lambda: bamba("*M*M"),
    "granite_h-rope": lambda: granite_h("M*MM", position_embedding_type="rope"),
    "granite_h-moe": lambda: granite_h("*MM*", **EXPERTS),
    "qwen3_next": lambda: gdn.tiny("dense"),
    "qwen3_next-sparse-step": lambda: gdn.tiny("moe-sparse-step"),
    "qwen3_5": lambda: gdn.tiny("qwen3_5"),
    "qwen3_5_moe": lambda: gdn.tiny("qwen3_5_moe"),
    "falcon_h1": lambda: falcon_h1(3),
}
EXPERTS_ONLY_BF16 = {"granite_h-moe", "qwen3_next-sparse-step", "qwen3_5_moe"}

# (precision, attention, checkpoint, zero, world)
SETUPS = [
    ("fp32", "naive", "none", 3, 4),
    ("fp32", "sdpa", "full", 2, 6),
    ("bf16", "sdpa", "none", 2, 3),
    ("bf16", "naive", "full", 3, 8),
    ("amp-bf16", "naive", "none", 3, 5),
    ("amp-bf16", "sdpa", "full", 2, 7),
    ("amp-bf16", "sdpa", "none", 3, 2),
]
CASES = [(name, *s) for name in MODELS for s in SETUPS if not (name in EXPERTS_ONLY_BF16 and s[0] == "fp32")]
S, B = 12, 2  # Mamba2: a second chunk of 8, padded; Gated DeltaNet: one chunk of 64, padded


def check_rank(cfg, setup: TrainingSetup, zero: int, world: int, seq: int = S) -> None:
    """Rank 0 of FSDP2 (``zero``, ``world`` ranks) over transformers' model: the replay equals the fake-PG job."""
    layout = ParallelLayout(dp=world, zero=zero)
    lines = predict_step(cfg, seq, setup, impl="transformers", batch=B, layout=layout)
    assert lines.at(B) == measure_hf_step(cfg, seq, B, setup, device="meta", layout=layout), (cfg.name, setup.label)


@pytest.mark.grid
@pytest.mark.parametrize("name, precision, attention, checkpoint, zero, world", CASES, ids=str)
def test_fsdp2_rank_of_a_hybrid_equals_the_fake_pg_job(name, precision, attention, checkpoint, zero, world):
    cfg = MODELS[name]()
    check_rank(cfg, TrainingSetup(attention=attention, precision=precision, checkpoint=checkpoint), zero, world)


@pytest.mark.parametrize(
    "name, setup, zero, world",
    [
        ("dense", TrainingSetup(attention="sdpa"), 3, 4),
        ("qwen3_5_moe", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full"), 2, 6),
    ],
    ids=["qwen3_next-fp32-zero3", "qwen3_5_moe-amp-full-zero2"],
)
def test_gated_deltanet_chunk_loop_under_fsdp2_equals_the_fake_pg_job(name, setup, zero, world):
    """S = 520: nine chunks of 64, the middle ones replayed once inside a layer (``chunk_gated_delta_rule``'s
    ``repeated``) between FSDP2's unit events."""
    check_rank(gdn.tiny(name), setup, zero, world, seq=520)


def test_each_kind_of_layer_is_its_own_unit_by_hand():
    """Nemotron-H ``M*-M`` at world 4 in fp32 (no dim 0 padded): the Mamba2 block is its norm 32, in_proj 84·32,
    conv1d 48·4 and its bias 48, dt_bias, A_log and D 4 each, the gated norm 32 and out_proj 32·32 = 4,028
    elements; the attention block 32 + q 32·32 + k, v 16·32 + o 32·32 = 3,104; the MLP block 32 + up 64·32 + down
    32·64 = 4,128.  Three units, layer 3 sharing layer 0's; each gathers all its elements (4 B) and keeps a
    quarter of their gradients."""
    from lm_accounting.analytic.ops.fsdp import FullyShard
    from lm_accounting.analytic.ops.tensors import Run
    from lm_accounting.analytic.ops.transformers import nemotron_h

    cfg, setup = tiny("M*-M"), TrainingSetup()
    shard = FullyShard(cfg, setup, ParallelLayout(dp=4, zero=3))
    with Run():
        shard.shard(nemotron_h.causal_lm(cfg, S, setup))
    assert shard.units.kinds == (0, 1, 2, 0)
    assert [u.gathered for u in shard.units.blocks] == [4 * 4_028, 4 * 3_104, 4 * 4_128]
    assert [u.reduce_out for u in shard.units.blocks] == [4_028, 3_104, 4_128]


def test_runs_of_alike_layers_are_cut_where_the_units_around_them_differ():
    """``MMMM*MMM-M``: without FSDP2 the middle Mamba2 layers are replayed in runs of one letter (1-3 and 5-7);
    under FSDP2 layer 1 follows the Mamba2 unit of layer 0 (as layers 2 and 3 do) but layer 3 precedes the attention
    unit in backward, and layer 5 follows it: runs (1, 2), (3, 1), (5, 1), (6, 1), (7, 1)."""
    from lm_accounting.analytic.ops.fsdp import FullyShard
    from lm_accounting.analytic.ops.tensors import Run
    from lm_accounting.analytic.ops.transformers import nemotron_h

    cfg, setup = tiny("MMMM*MMM-M"), TrainingSetup()
    with Run():
        program = nemotron_h.causal_lm(cfg, S, setup)
        assert program.runs() == [(0, 1), (1, 3), (4, 1), (5, 3), (8, 1), (9, 1)]
        FullyShard(cfg, setup, ParallelLayout(dp=2, zero=3)).shard(program)
        assert program.runs() == [(0, 1), (1, 2), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)]


def test_memory_predicts_rank_zero_of_a_hybrid_config_json(run_cli, tmp_path):
    """``lm-account memory <Nemotron-H config.json> --dp 8 --zero 3 --impl transformers``: rank 0's step, not
    model states only."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NEMOTRON_H, "hybrid_override_pattern": "M*-M"}))
    r = run_cli("memory", path, "-S", "64", "--dp", "8", "--zero", "3", "--impl", "transformers")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "rank 0" in r.out and "fsdp_hybrid" in r.out
    r = run_cli("memory", path, "-S", "64", "--dp", "8", "--zero", "3")  # a layout defaults to the course's model
    assert (
        r.code == 2 and "--impl transformers --dp N replays DDP, ZeRO-1 or FSDP2" in r.err and "Traceback" not in r.err
    )


def norm_h1(layers: int, before: bool, **fields):
    return falcon_h1(layers, mamba_rms_norm=True, mamba_norm_before_gate=before, **fields)


WIDE = dict(mamba_d_ssm=256, mamba_d_head=64, vocab_size=16)  # the mixer's tensors the largest


@pytest.mark.parametrize("before", [True, False], ids=["norm-then-gate", "gate-then-norm"])
@pytest.mark.parametrize(
    "layers, fields, seq, setup",
    [
        (2, {}, 12, TrainingSetup(attention="naive")),
        (2, {}, 12, TrainingSetup(attention="sdpa", precision="bf16")),
        (3, {}, 12, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
        (3, {}, 9, TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
        (2, WIDE, 12, TrainingSetup(attention="naive")),
        (3, WIDE, 16, TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ],
    ids=str,
)
def test_falcon_h1_gated_norm_equals_transformers(before, layers, fields, seq, setup):
    """``FalconH1RMSNormGated`` (models/falcon_h1/modeling_falcon_h1.py:238-273): the gate's SiLU in fp32 multiplied
    before or after the per-group norm in fp32, the weight viewed (G, W/G), cast back to the input's dtype; the
    norm's weight a parameter of the mixer between ``in_proj`` and ``out_proj``."""
    from test_ops_transformers_llama import check

    from lm_accounting.analytic.ops import unsupported

    cfg = norm_h1(layers, before, **fields)
    assert cfg.mamba_norm and cfg.mamba_norm_before_gate is before
    assert unsupported(cfg, setup, "transformers") == []
    check(cfg, seq, setup)


@pytest.mark.parametrize(
    "before, precision, zero, world",
    [
        (True, "fp32", 3, 4),
        (False, "bf16", 2, 6),
        (False, "fp32", 3, 3),
        (True, "bf16", 3, 8),
        (False, "amp-bf16", 3, 5),
    ],
    ids=str,
)
def test_fsdp2_rank_of_falcon_h1_with_its_gated_norm_equals_the_fake_pg_job(before, precision, zero, world):
    setup = TrainingSetup(attention="sdpa", precision=precision, checkpoint="full" if zero == 3 else "none")
    check_rank(norm_h1(3, before), setup, zero, world)


@pytest.mark.parametrize("before", [True, False], ids=["norm-then-gate", "gate-then-norm"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive"), TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")],
    ids=lambda s: s.label,
)
def test_falcon_h1_gated_norm_plain_cpu_run_equals_the_cpu_allocator(before, setup):
    from test_ops_transformers_zoo import check_plain

    check_plain(norm_h1(3, before), S, B, setup)


def test_the_gate_order_is_read_and_written_back():
    """``mamba_norm_before_gate`` is read from the config.json (not ignored) and written back for transformers."""
    from lm_accounting.hf_config import to_hf_dict

    cfg = norm_h1(2, False)
    assert "mamba_norm_before_gate" not in cfg.ignored_fields
    assert to_hf_dict(cfg)["mamba_norm_before_gate"] is False and to_hf_dict(norm_h1(2, True))["mamba_rms_norm"]


def _short_conv_and_mamba_v1():
    from test_ops_transformers_lfm2 import LFM2_MOE, lfm2, mamba2
    from test_ops_transformers_mamba import jamba, tiny

    return {
        "lfm2-CACCC": lambda: lfm2("CACCC"),  # a run of three short convolutions after attention: cut
        "lfm2_moe-CCACCC": lambda: lfm2("CCACCC", base=LFM2_MOE),
        "jamba-6": lambda: jamba(6, 2, 1),  # Mamba and attention alternating
        "jamba-8-moe": lambda: jamba(8, 4, 1, 4),
        "mamba": lambda: tiny("mamba", 3),
        "falcon_mamba": lambda: tiny("falcon_mamba", 3),  # its unused norm buffers stay fp32 under the policy
        "mamba2": lambda: mamba2(),
    }


@pytest.mark.parametrize(
    "name, precision, checkpoint, zero, world",
    [
        ("lfm2-CACCC", "fp32", "none", 3, 4),
        ("lfm2-CACCC", "bf16", "full", 2, 3),
        ("lfm2-CACCC", "amp-bf16", "full", 2, 3),
        ("lfm2_moe-CCACCC", "bf16", "full", 2, 3),
        ("lfm2_moe-CCACCC", "amp-bf16", "none", 3, 2),
        ("jamba-6", "fp32", "none", 3, 4),
        ("jamba-8-moe", "bf16", "full", 2, 3),
        ("jamba-8-moe", "amp-bf16", "none", 3, 2),
        ("mamba", "amp-bf16", "full", 2, 3),
        ("falcon_mamba", "amp-bf16", "none", 3, 2),
        ("mamba2", "amp-bf16", "none", 3, 2),
    ],
)
def test_fsdp2_rank_of_short_conv_and_mamba_models_equals_the_fake_pg_job(name, precision, checkpoint, zero, world):
    """LFM2's and Jamba's layers of unlike parameters (``split_runs`` cuts their runs where FSDP2's units differ), and
    under FSDP2's bf16 policy the Mamba programs too (``ops.fsdp.POLICY_EXACT``)."""
    cfg = _short_conv_and_mamba_v1()[name]()
    check_rank(cfg, TrainingSetup(attention="naive", precision=precision, checkpoint=checkpoint), zero, world)


def test_a_unit_of_mixed_parameter_dtypes_is_refused_as_torch_refuses_it():
    """GLM-4.5's sparse layers keep their router's score bias in fp32 beside bf16 weights: torch's ``fully_shard``
    refuses such a unit (``FSDPParamGroup._init_mp_dtypes``: "FSDP expects uniform original parameter dtype"), so the
    prediction refuses the job in one line rather than predicting one that cannot run."""
    from test_hf_zoo import ZOO

    from lm_accounting.hf_config import config_from_hf

    cfg = config_from_hf({"model_type": "glm4_moe", **ZOO["glm4_moe"]})
    setup, layout = TrainingSetup(attention="naive", precision="bf16"), ParallelLayout(dp=2, zero=3)
    with pytest.raises(ValueError, match="uniform original parameter dtype"):
        predict_step(cfg, S, setup, impl="transformers", batch=B, layout=layout)
    with pytest.raises(AssertionError, match="uniform original parameter dtype"):
        measure_hf_step(cfg, S, B, setup, device="meta", layout=layout)
