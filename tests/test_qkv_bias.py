"""Qwen2's q/k/v projection biases (``qkv_bias``), replayed and proven on measured runs.

The live model adds each bias in its own ``Bias`` module after the matmul (model/layers.py): a fresh
output of the projection's size, the bias gradient a sum over the tokens, and under amp-bf16 an fp32
q, k and v (the fp32 bias promotes the bf16 matmul output), whose RoPE runs in fp32 and whose
attention matmuls (and fused kernel) take bf16 copies.  Single GPU, every setup, traced and plain:
the ``gqa+qkv_bias`` variant of tests/test_memory_setups.py, tests/test_plain_run.py and
tests/test_memory_exact.py.  Here: a Hugging Face qwen2 config.json end to end, the multi-GPU ranks
(DDP, ZeRO-1, FSDP2, TP with column-parallel biases, sequence and vocab parallel) and the FLOPs."""

import dataclasses
import json

import pytest

pytest.importorskip("torch")

from test_parallel_measured import SETUPS, TINY
from test_tensor_parallel_measured import GRID

from lm_accounting.analytic.flops import nonmatmul_flops
from lm_accounting.analytic.parallel import model_states, rank_step
from lm_accounting.analytic.replay import predict_training_step
from lm_accounting.config import load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.measure.crosscheck import crosscheck
from lm_accounting.measure.distributed import measure_rank
from lm_accounting.setup import TrainingSetup

QWEN2_TINY = dataclasses.replace(TINY, qkv_bias=True, name="tiny-qwen2")
S = 16

# a Qwen2.5 config.json (model_type qwen2: q/k/v biases, RMSNorm, SwiGLU, RoPE) at tiny shapes
HF_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 24,
    "intermediate_size": 40,
    "max_position_embeddings": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 101,
}


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_hf_qwen2_config_json_gets_a_measured_peak(run_cli, tmp_path, precision):
    """``lm-account memory config.json`` on a qwen2 config: an exact peak (no states-only refusal), equal to
    the measured run in every phase; the bias-free twin's prediction is not (the test can fail)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_QWEN2))
    args = ("memory", path, "-S", 16, "-B", 2, "--precision", precision, "--attention", "sdpa", "--impl", "course")
    r = run_cli(*args, "--measure", "meta", "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    traced = data["implementation_exact"]["step_traced"]
    for phase in ("forward", "backward", "optimizer_step"):
        assert data["measured"][phase] == traced[phase]
    cfg = load_config(path)
    assert cfg.qkv_bias and cfg.family == "Qwen2-style (QKV bias)"
    twin = predict_training_step(
        dataclasses.replace(cfg, qkv_bias=False), 16, 2, setup=_setup(precision), mode="traced"
    )
    assert data["measured"]["backward"]["peak"] != twin.backward.peak
    default = run_cli("memory", path, "--impl", "course")  # naive fp32 for cuda at the config's context (32)
    assert default.code == 0 and "step peak" in default.out
    # no GPU ran a block with q/k/v biases (reports/cuda: Llama-like and MoE blocks only): not called exact on cuda
    assert "not exact there: this architecture was not run on a GPU" in default.out


def _setup(precision: str) -> TrainingSetup:
    return TrainingSetup(attention="sdpa", precision=precision)


DP = {
    "ddp": ParallelLayout(dp=4, zero=0),
    "zero1": ParallelLayout(dp=4, zero=1),
    "zero2": ParallelLayout(dp=4, zero=2),
    "zero3": ParallelLayout(dp=4, zero=3),
    "fsdp×tp+sp": ParallelLayout(dp=2, zero=3, tp=2, sequence_parallel=True),
    "tp+sp+vp": ParallelLayout(tp=2, sequence_parallel=True, vocab_parallel=True),
}


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("name", DP)
def test_data_parallel_and_fsdp_ranks_are_exact(name, setup):
    m = measure_rank(QWEN2_TINY, S, 1, setup, DP[name])
    assert m.step == rank_step(QWEN2_TINY, S, 1, setup, DP[name], mode="traced")[0]


@pytest.mark.grid
@pytest.mark.parametrize(
    "lay", [ParallelLayout(tp=2), ParallelLayout(tp=2, sequence_parallel=True)], ids=["tp", "tp+sp"]
)
@pytest.mark.parametrize("case", GRID, ids=lambda c: "+".join(map(str, c)))
def test_tp_rank_with_column_parallel_biases_is_exact(case, lay):
    attention, checkpoint, precision, batch = case
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    m = measure_rank(QWEN2_TINY, S, batch, setup, lay)
    assert m.step == rank_step(QWEN2_TINY, S, batch, setup, lay, mode="traced")[0]


def test_tp_shards_the_biases_column_wise():
    """A TP rank of 2 holds half of each q/k/v bias (Shard(0), as its weight's rows): per layer
    1. (q_dim + 2·kv_dim)/tp = (24 + 2·12)/2 = 24 elements, 2. × 2 layers × 4 bytes (fp32) = 192 bytes."""
    lay, setup = ParallelLayout(tp=2), TrainingSetup()
    biased = model_states(QWEN2_TINY, setup, lay).parameters
    assert biased - model_states(TINY, setup, lay).parameters == 192
    assert measure_rank(QWEN2_TINY, S, 1, setup, lay).params == biased


@pytest.mark.parametrize("setup", [TrainingSetup(), TrainingSetup(attention="sdpa", precision="amp-bf16")], ids=str)
def test_flops_crosscheck_and_bias_adds(setup):
    """The bias adds are no matmul FLOPs (fvcore and FlopCounterMode count a plain add as 0): the
    matmul cross-check is exact, and the elementwise count has 1 add per output element,
    T·(q_dim + 2·kv_dim) = 3·16·(24 + 2·12) = 2,304 per layer at B = 3, S = 16."""
    cc = crosscheck(QWEN2_TINY, seq=S, batch=3, device="cpu", backward=True, setup=setup)
    assert cc.mismatches() == []
    nm = nonmatmul_flops(QWEN2_TINY, S, 3)
    adds = sum(nm[f"layers.*.attn.{p}_proj.bias"].per_layer for p in "qkv")
    assert adds == 2_304
