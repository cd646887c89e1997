"""transformers' Llama 4 text model replayed by its op-library program (issues 26 and 30): ``Llama4ForCausalLM``
(``analytic.ops.transformers.llama4``) equals transformers' own model measured by the storage tracker on meta, phase
by phase, byte for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``), and its plain CPU run equals the
CPU allocator's events (``test_ops_transformers_zoo.check_plain``).

What the configs exercise (``models/llama4/modeling_llama4.py``): the complex RoPE (``torch.polar``,
``view_as_complex``, a complex product, ``view_as_real``) on the RoPE layers; the NoPE layers (``no_rope_layers``
0) with attention temperature tuning (an fp32 factor over the positions); the L2 q/k norm (``use_qk_norm``);
chunked masks on the RoPE layers (``attention_chunk_size`` 8: materialized at S = 12, skipped by sdpa at S = 6) and
the full mask on the NoPE ones; ``Llama4TextMoe`` (sigmoid of the scattered top-k logits, every token repeated
through all E experts' ``bmm``, the shared expert, the sum added in place) every ``interleave_moe_layer_step``-th
layer and the dense MLP of ``intermediate_size_mlp`` elsewhere.  ``Llama4TextExperts`` runs ``torch.bmm``, not
``grouped_mm``, so the fp32 model is measured on meta too.  The configs are small config.json objects read by
``hf_config.config_from_hf`` (no value copied from our own output).
"""

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

TINY = dict(
    model_type="llama4_text",
    vocab_size=96,
    hidden_size=32,
    intermediate_size=16,
    intermediate_size_mlp=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    attention_chunk_size=8,
    max_position_embeddings=64,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
"""Layers 0-2 RoPE with chunks of 8 and the L2 q/k norm, layer 3 NoPE with temperature tuning (the class's default
``no_rope_layers``: every 4th); layers 1 and 3 a mixture of 4 experts (top-1) and a shared expert, 0 and 2 dense."""
VARIANTS = {
    "tiny": {},
    # every layer sparse, top-2, biased attention, no q/k norm, the NoPE layer in the middle
    "top2-bias": dict(
        num_hidden_layers=3,
        num_experts_per_tok=2,
        interleave_moe_layer_step=1,
        attention_bias=True,
        use_qk_norm=False,
        no_rope_layers=[1, 0, 1],
    ),
    # no chunked attention (every layer full), no temperature tuning, 8 experts
    "unchunked": dict(attention_chunk_size=None, attn_temperature_tuning=False, num_local_experts=8),
}


def tiny(variant: str = "tiny"):
    return config_from_hf({**TINY, **VARIANTS[variant]})


def label(setup: TrainingSetup) -> str:
    return "-".join(setup.to_dict().values())


CASES = [
    ("tiny", 12, TrainingSetup(attention="naive")),
    ("tiny", 12, TrainingSetup(attention="naive", precision="bf16")),
    ("tiny", 12, TrainingSetup(attention="sdpa", checkpoint="full")),
    ("tiny", 6, TrainingSetup(attention="sdpa", precision="bf16")),  # S < chunk: sdpa skips the chunked mask
    ("tiny", 12, TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ("tiny", 12, TrainingSetup(attention="naive", checkpoint="full", optimizer="for-loop")),
    # amp-bf16: the router's bf16 logits, the fp32 sum of the experts (sum is an fp32 op), fp32 temperature factor
    ("tiny", 12, TrainingSetup(attention="naive", precision="amp-bf16")),
    ("tiny", 12, TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
    ("top2-bias", 12, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ("top2-bias", 12, TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ("unchunked", 12, TrainingSetup(attention="sdpa")),
    ("unchunked", 12, TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
]


@pytest.mark.parametrize("variant, seq, setup", CASES, ids=lambda v: v if isinstance(v, str | int) else label(v))
def test_llama4_equals_transformers(variant, seq, setup):
    """The whole training step (forward, backward, AdamW) against ``Llama4ForCausalLM`` on meta at B = 1, 2, 3."""
    check(tiny(variant), seq, setup)


@pytest.mark.parametrize(
    "variant, setup",
    [
        ("tiny", TrainingSetup(attention="naive")),
        ("tiny", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
        ("tiny", TrainingSetup(attention="naive", precision="amp-bf16")),
        ("top2-bias", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, str) else label(v),
)
def test_llama4_plain_cpu_run_equals_the_cpu_allocator(variant, setup):
    """No dispatch mode: gradients summed in place, Python numbers wrapped (the temperature factor's, the chunk's
    floor division), the CPU flash kernel's scratch."""
    check_plain(tiny(variant), 12, 2, setup)


def test_llama4_under_amp_bf16_equals_transformers_on_cpu_tensors():
    """The traced run on cpu tensors (``--measure cpu``: the storage tracker over real kernels, whose internal casts
    it does not see) at B = 1 and 2."""
    from lm_accounting.measure.hf import measure_hf_step

    setup = TrainingSetup(attention="naive", precision="amp-bf16")
    for batch in (1, 2):
        lines = predict_step(tiny(), 12, setup, impl="transformers", batch=batch, device="cpu")
        assert lines.at(batch) == measure_hf_step(tiny(), 12, batch, setup, device="cpu"), batch


def test_llama4_selective_checkpointing_is_refused():
    """transformers checkpoints whole decoder layers: selective checkpointing is refused with its reason."""
    reasons = unsupported(tiny(), TrainingSetup(checkpoint="selective"), impl="transformers")
    assert reasons == ["transformers has no selective activation checkpointing"]
    assert unsupported(tiny(), TrainingSetup(attention="sdpa", precision="bf16"), impl="transformers") == []


def test_llama4_memory_cli_predicts_the_step(run_cli, tmp_path):
    """``lm-account memory --measure meta`` on a Llama 4 config.json at S = 64 (eight chunks of 8): the replayed step
    beside transformers' model under the storage tracker, every phase's bytes equal (rel. error 0)."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    r = run_cli("memory", path, "-S", "64", "--impl", "transformers", "--attention", "sdpa", "--measure", "meta")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "exact prediction for meta" in r.out
    phases = [
        line
        for line in r.out.splitlines()
        if line.startswith(("baseline:", "forward (", "backward:", "AdamW step + zero_grad:"))
    ]
    assert len(phases) == 7 and all("+0.0000%" in line for line in phases), phases


# -- FSDP2 over Llama 4 on the fake process group --------------------------------------------------------------

# (interleave_moe_layer_step, layers): the dense layers between two sparse ones are a run of step - 1 alike layers
# whose first follows a sparse FSDP2 unit and whose last precedes one (their prefetch and reshard events differ
# from a middle layer's): from step 3 on the program cuts such a run there (``tensors.split_runs``) instead of
# refusing it, as the hybrids' programs do.  Layers 0, 1, 2 of step 4 are three dense layers, then one sparse.
STEPS = {"every": (1, 3), "step2": (2, 4), "step3": (3, 6), "step4": (4, 8), "step5": (5, 5)}


def fsdp_check(step: str, setup: TrainingSetup, zero: int, world: int = 4, batch: int = 1) -> None:
    """Rank 0 of FSDP2 (``fully_shard`` on every decoder layer, then the root) over ``world`` ranks: the replay
    equals transformers' model on the fake process group (FakeTensors: Llama 4's experts run ``bmm``)."""
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf import measure_hf_step

    every, layers = STEPS[step]
    cfg = config_from_hf({**TINY, "interleave_moe_layer_step": every, "num_hidden_layers": layers})
    layout = ParallelLayout(dp=world, zero=zero)
    lines = predict_step(cfg, 12, setup, impl="transformers", batch=batch, layout=layout)
    assert lines.at(batch) == measure_hf_step(cfg, 12, batch, setup, device="meta", layout=layout), (step, zero)


def test_fsdp2_cuts_the_dense_runs_between_sparse_layers():
    """Step 4 over 8 layers: the runs of alike layers (``alike_runs``: kind, window, RoPE) are (0, 3), (3, 1),
    (4, 3), (7, 1) (layers 3 and 7 sparse, NoPE by the class's default); each run of three dense layers meets
    unlike FSDP2 events at its ends, which the replay refused (``FullyShard._check_run``) before the program cut
    it."""
    fsdp_check("step4", TrainingSetup(precision="bf16"), 3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "step, setup, zero, batch",
    [
        ("step3", TrainingSetup(), 3, 2),
        ("step3", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full"), 2, 1),
        ("step5", TrainingSetup(precision="amp-bf16"), 3, 2),  # the bf16 policy over the fp32 model
        ("step4", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"), 2, 3),
        ("every", TrainingSetup(precision="bf16"), 3, 1),
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else str(v),
)
def test_fsdp2_over_llama4_equals_the_fake_pg_job(step, setup, zero, batch):
    fsdp_check(step, setup, zero, batch=batch)


FSDP_SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c)
    for a in ("naive", "sdpa")
    for p in ("fp32", "bf16", "amp-bf16")
    for c in ("none", "full")
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", FSDP_SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("world", [4, 64])
@pytest.mark.parametrize("step", list(STEPS))
def test_fsdp2_llama4_grid(step, world, zero, setup):
    """Every interleave step 1..5, world 4 and 64 (every dim 0 padded), ZeRO-2 and 3, every setup."""
    fsdp_check(step, setup, zero, world)
