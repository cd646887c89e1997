"""transformers' DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention) replayed by their op-library program
(``analytic.ops.transformers.deepseek_v32``, issues 26 and 30) equal transformers' own ``DeepseekV32ForCausalLM`` and
``GlmMoeDsaForCausalLM``, phase by phase, byte for byte, at B = 1, 2 and 3 (``test_ops_transformers_moe.check``), and
their plain CPU runs equal the CPU allocator's events.

The program is DeepSeek-V3's (test_ops_transformers_deepseek.py) plus the indexer in every layer (GLM-5: in its
``full`` layers): its projections, the S² tensors it makes under ``torch.no_grad()`` (the keys broadcast and copied
to (B, S, d_I, S) by ``torch.matmul``, the (B, S, H_I, S) scores, their scaled and ReLU'd copies, the (B, S, S)
index scores and their masked copy), the top-k, the (B, 1, S, S) ``index_mask`` and the masked attention mask,
which the attention then takes (eager: an additive mask; sdpa: a bool mask, no ``is_causal``).  As for DeepSeek-V3:
grouped_mm's meta kernel takes bf16 only, so fp32 and amp-bf16 are measured by the storage tracker on cpu tensors,
bf16 on meta; a value head (6) unlike the query/key head (8 + 4) sends CPU sdpa to torch's math path, ``v_head_dim``
12 to the flash kernel (with the mask).  The indexer's weights get no gradient, so AdamW holds no state for them
(``measure.hf.mark_unreached`` finds them by a probe backward; the program's ``untrained``).
"""

import json

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from test_ops_transformers_deepseek import SHAPE as DEEPSEEK
from test_ops_transformers_moe import check  # B = 1, 2, 3 against the storage tracker
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

SHAPE = dict(
    DEEPSEEK,  # DeepSeek-V3's tiny widths (tests/test_ops_transformers_deepseek.py)
    model_type="deepseek_v32",
    index_n_heads=2,
    index_head_dim=8,
    index_topk=4,
)
"""Two indexer heads of 8 (4 of them RoPE), top 4 of 8 tokens: half the keys masked by the indexer."""

VARIANTS = {
    "v32": {},
    "v32-flash": {"v_head_dim": 12},  # one head size for q, k and v: the CPU flash kernel, with the mask
    "v32-topk-over-s": {"index_topk": 16},  # top min(16, S): every key kept
    "glm5": {"model_type": "glm_moe_dsa", "n_group": 1, "topk_group": 1},  # the indexer's RoPE interleaved
    # shared layers take the previous full layer's top-k (the loop keeps it; a checkpointed layer's frame too)
    "glm5-shared": {
        "model_type": "glm_moe_dsa",
        "num_hidden_layers": 5,
        "indexer_types": ["full", "shared", "shared", "full", "shared"],
    },
}


def tiny(name: str):
    return config_from_hf({**SHAPE, **VARIANTS[name]})


def label(setup: TrainingSetup) -> str:
    return "-".join(setup.to_dict().values())


CPU_CASES = [
    ("v32", TrainingSetup(attention="naive")),
    ("v32", TrainingSetup(attention="sdpa", checkpoint="full")),
    ("v32", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
    ("v32-flash", TrainingSetup(attention="sdpa")),
    ("v32-topk-over-s", TrainingSetup(attention="naive", checkpoint="full")),
    ("glm5", TrainingSetup(attention="sdpa", checkpoint="full")),
    ("glm5-shared", TrainingSetup(attention="naive")),
]


@pytest.mark.parametrize("name, setup", CPU_CASES, ids=[f"{n}-{label(s)}" for n, s in CPU_CASES])
def test_dsa_equals_transformers_under_the_tracker(name, setup):
    """fp32 and amp-bf16 on cpu tensors: the indexer's fp32 scores (under autocast both matmuls bf16), the eager
    additive mask or sdpa's bool mask (math path or flash kernel), the index mask and the masked attention mask,
    checkpointing's recompute of the indexer, GLM-5's top-k handed from layer to layer."""
    check(tiny(name), 8, setup)


META_CASES = [
    ("v32", TrainingSetup(attention="naive", precision="bf16")),
    ("v32", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ("v32-flash", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ("glm5-shared", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
]


@pytest.mark.parametrize("name, setup", META_CASES, ids=[f"{n}-{label(s)}" for n, s in META_CASES])
def test_dsa_bf16_equals_transformers_on_meta(name, setup):
    check(tiny(name), 12, setup, device="meta")


def test_glm5_runs_of_full_layers_equal_transformers():
    """Six full layers: the middle runs replayed once (``repeated``), each layer's top-k living through the next."""
    cfg = config_from_hf({**SHAPE, **VARIANTS["glm5"], "num_hidden_layers": 6})
    check(cfg, 8, TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full"), device="meta")


PLAIN_CASES = [
    ("v32", TrainingSetup(attention="naive"), 1),
    ("v32", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full"), 2),
    ("v32-flash", TrainingSetup(attention="sdpa"), 2),
    ("glm5-shared", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full"), 2),
]


@pytest.mark.parametrize("name, setup, batch", PLAIN_CASES, ids=[f"{n}-{label(s)}-B{b}" for n, s, b in PLAIN_CASES])
def test_dsa_plain_cpu_run_equals_the_cpu_allocator(name, setup, batch):
    """No dispatch mode: the wrapped Python numbers, the CPU flash kernel's scratch with the mask."""
    check_plain(tiny(name), 8, batch, setup)


def test_the_indexer_sets_the_forward_peak_with_its_s_squared_key_copy():
    """Under full checkpointing in fp32 the forward peak is the indexer's first matmul, ``torch.matmul(q.float(),
    k.transpose(-1, -2).float().unsqueeze(1))``: its bmm's output (B·S, H_I, S) and the keys broadcast to
    (B, S, d_I, S) and copied to 3-d (``_matmul_impl``), 4·S²·d_I bytes per sequence (at B = 1 the reshape is a
    view: the broadcast dim merges with the batch of 1).  At B = 2, widening the indexer's head from d_I = 24 to 40
    (index_topk above S: every key kept) adds to the peak above the baseline, per sequence, that copy's 4·S²·16
    bytes and 4·S·16 bytes for each of the four other live tensors of width d_I per token or head:
    ``wq_b``'s output (its no-RoPE part still viewed by ``q_pass``) and the query's ``cat`` (H_I = 2 heads each),
    the key's LayerNorm output (viewed by ``k_pass``) and its ``cat``.  Against transformers at S = 16 and 32."""
    from lm_accounting.measure.hf import measure_hf_step

    setup = TrainingSetup(attention="naive", checkpoint="full")
    heads = SHAPE["index_n_heads"]
    for seq in (16, 32):
        above = []
        for d_i in (24, 40):
            cfg = config_from_hf({**SHAPE, "index_head_dim": d_i, "index_topk": 128, "max_position_embeddings": 128})
            step = predict_step(cfg, seq, setup, impl="transformers", batch=2, device="cpu").at(2)
            assert step == measure_hf_step(cfg, seq, 2, setup, device="cpu")
            above.append(step.forward.peak - step.baseline)
        assert above[1] - above[0] == 2 * (4 * seq * seq * 16 + 4 * seq * 16 * (2 * heads + 2)), seq


@pytest.mark.parametrize(
    "setup, reason",
    [(TrainingSetup(checkpoint="selective"), "no selective activation checkpointing")],
    ids=["selective"],
)
def test_what_is_not_transliterated_is_refused(setup, reason):
    cfg = tiny("v32")
    reasons = unsupported(cfg, setup, "transformers")
    assert any(reason in r for r in reasons), reasons
    with pytest.raises(ValueError, match=reason):
        predict_step(cfg, 8, setup, impl="transformers")
    for name in VARIANTS:
        assert unsupported(tiny(name), TrainingSetup(attention="naive"), "transformers") == []


def test_fsdp2_over_dsa_is_refused():
    """As over DeepSeek-V3 (``ops.fsdp``: torch's fully_shard refuses its fp32 router beside bf16 weights)."""
    from lm_accounting.layout import ParallelLayout

    for name in ("v32", "glm5"):
        with pytest.raises(ValueError, match="FSDP2 over transformers'"):
            predict_step(tiny(name), 8, TrainingSetup(), impl="transformers", layout=ParallelLayout(dp=4, zero=2))


@pytest.mark.parametrize("name", ["v32", "glm5-shared"])
def test_memory_prints_the_exact_step_of_a_dsa_config_json(run_cli, tmp_path, name):
    """``lm-account memory`` on a DeepSeek-V3.2 or GLM-5 config.json gives the replayed step (not the model states
    alone), and ``--measure meta`` finds transformers' model equal to it at every phase."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SHAPE, **VARIANTS[name]}))
    r = run_cli("memory", path, "-S", "64", "--precision", "bf16", "--measure", "meta")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "step peak" in r.out
    rows = [line for line in r.out.splitlines() if "+0.0000%" in line]
    assert len(rows) == 7, r.out  # baseline, and each phase's peak and end, equal to the measurement


# -- DDP (the HF Trainer's find_unused_parameters=True) over the indexer's unreached weights -----------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, zero, setup",
    [
        ("v32", 0, TrainingSetup(attention="naive")),
        ("v32", 1, TrainingSetup(attention="naive")),
        ("glm5", 0, TrainingSetup(precision="amp-bf16")),
        ("v32-flash", 0, TrainingSetup(attention="sdpa", precision="bf16")),  # fp32 router: two dtype buckets
    ],
    ids=lambda v: label(v) if isinstance(v, TrainingSetup) else str(v),
)
def test_ddp_over_dsa_equals_the_cpu_job(name, zero, setup):
    """DDP (or ZeRO-1) over 2 ranks with ``find_unused_parameters=True``: the indexer's weights are marked ready
    unused (their bucket slots zeroed in place), keep ``.grad`` None and get no AdamW state; the replay equals the
    fake-PG job on real CPU tensors, and its all-reduces (the fp32 router's bucket first in bf16: the buckets run
    in reversed order of their first parameter, then the used-parameter map) the job's."""
    from lm_accounting.analytic.ops.ddp import Replicate, predict_rank
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf_parallel import measure_hf_rank

    cfg, layout = tiny(name), ParallelLayout(dp=2, zero=zero)
    rep = Replicate(layout, find_unused=True)
    lines = predict_rank(cfg, 8, setup, layout, impl="transformers", batch=1, replicate=rep)
    calls: list = []
    got = measure_hf_rank(cfg, 8, 1, setup, layout, fake=False, collectives=calls, find_unused=True)
    assert got == lines.at(1)
    assert [b for kind, b, _ in calls if kind == "all_reduce"] == rep.all_reduces()


def test_ddp_over_dsa_refusals():
    """find_unused_parameters=False (the reducer fails on the unreached weights) and ZeRO-1 over a bf16 model
    with DeepSeek's fp32 router (torch's ZeroRedundancyOptimizer refuses mixed dtypes) are refused with why."""
    from lm_accounting.analytic.ops.ddp import Replicate
    from lm_accounting.layout import ParallelLayout

    ddp, zero1 = ParallelLayout(dp=2, zero=0), ParallelLayout(dp=2, zero=1)
    with pytest.raises(ValueError, match="needs find_unused_parameters=True"):
        predict_step(tiny("v32"), 8, TrainingSetup(), impl="transformers", layout=ddp, replicate=Replicate(ddp))
    with pytest.raises(ValueError, match="ZeroRedundancyOptimizer refuses parameters of mixed dtypes"):
        predict_step(tiny("v32"), 8, TrainingSetup(precision="bf16"), impl="transformers", layout=zero1)
