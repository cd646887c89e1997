"""transformers' Mixtral and Qwen3-MoE replayed by the op library (``analytic.ops.transformers.moe``) equal
transformers' own models, phase by phase, byte for byte.

transformers 5.24 runs the experts with ``grouped_mm`` by default: every shape is the slot count T·k whatever the
routing.  Its meta kernel takes bf16 only, so the traced run is measured by the storage tracker on cpu tensors
(fp32, amp-bf16) or on meta (bf16), and the plain run by the CPU allocator.  Widths keep every grouped_mm row a
multiple of 16 bytes (the CPU kernel's rule in bf16).  A forced routing (every token to the same experts, most
experts empty) measures the same step: the prediction holds for any routing."""

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from test_ops_transformers_llama import PLAIN_SETUPS  # attention × precision × checkpointing

from lm_accounting.config import AccountingError
from lm_accounting.measure.hf import measure_hf_step

SHAPE = dict(
    vocab_size=96,
    hidden_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
    max_position_embeddings=64,
)
MODELS = {
    "mixtral": {"num_local_experts": 4, "intermediate_size": 16},
    "qwen3_moe": {"num_experts": 4, "moe_intermediate_size": 16, "intermediate_size": 24, "norm_topk_prob": True},
    "qwen3_moe-unnormalised": {"num_experts": 4, "moe_intermediate_size": 16, "intermediate_size": 24},
    "qwen3_moe-sparse-step": {
        "num_experts": 4,
        "moe_intermediate_size": 16,
        "intermediate_size": 24,
        "decoder_sparse_step": 2,  # layers 1 and 3 sparse, 0 and 2 dense
    },
}


def tiny(name: str):
    return config_from_hf({"model_type": name.split("-")[0], **SHAPE, **MODELS[name]})


def check(cfg, seq: int, setup: TrainingSetup, device: str = "cpu"):
    """The lines in B at B = 2 and 3 from one replay, B = 1 from its own, against the storage tracker."""
    lines = predict_step(cfg, seq, setup, impl="transformers", batch=2, device=device)
    for batch in (2, 3):
        assert lines.at(batch) == measure_hf_step(cfg, seq, batch, setup, device=device), (batch, setup)
    one = predict_step(cfg, seq, setup, impl="transformers", batch=1, device=device)
    assert one.at(1) == measure_hf_step(cfg, seq, 1, setup, device=device), (1, setup)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="sdpa"),
        TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full"),
    ],
    ids=["sdpa-fp32", "eager-amp-full"],
)
def test_moe_equals_transformers_under_the_tracker(name, setup):
    """Router (fp32 softmax, top-k, the in-place division and its clone), the sort, the two gathers, both
    grouped_mm with their saved offsets, the inverse permutation; checkpointing's early stop before the last
    gather's output exists."""
    check(tiny(name), 8, setup)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("checkpoint", ["none", "full"])
def test_bf16_runs_on_meta_and_equals(name, checkpoint):
    check(tiny(name), 12, TrainingSetup(attention="sdpa", precision="bf16", checkpoint=checkpoint), device="meta")


@pytest.mark.grid
@pytest.mark.parametrize("setup", PLAIN_SETUPS, ids=lambda s: "-".join(s.to_dict().values()))
@pytest.mark.parametrize("name", list(MODELS))
def test_moe_grid(name, setup):
    check(tiny(name), 8, setup)


@pytest.mark.parametrize(
    "name, setup",
    [
        ("mixtral", TrainingSetup(attention="sdpa")),
        ("qwen3_moe", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
        ("qwen3_moe", TrainingSetup(attention="sdpa", precision="bf16")),
    ],
)
def test_plain_cpu_run_equals_the_cpu_allocator(name, setup):
    cfg = tiny(name)
    threads = torch.get_num_threads()
    for batch in (1, 2):
        plain = predict_step(
            cfg, 8, setup, impl="transformers", batch=batch, mode="plain", device="cpu", cpu_threads=threads
        )
        assert plain.at(batch) == measure_hf_step(cfg, 8, batch, setup, device="cpu", method="allocator")


def test_any_routing_gives_the_same_step(monkeypatch):
    """Zero router weights: every token's softmax is uniform, top-k picks the same experts for all of them, the
    other experts get no rows.  The CPU allocator sees the same step as with the seeded router."""
    from transformers.models.mixtral import modeling_mixtral

    cfg, setup = tiny("mixtral"), TrainingSetup(attention="sdpa")
    seeded = measure_hf_step(cfg, 8, 2, setup, device="cpu", method="allocator")
    forward = modeling_mixtral.MixtralTopKRouter.forward
    picked = []

    def uniform(self, hidden_states):
        with torch.no_grad():
            self.weight.zero_()  # in place: no allocation
        out = forward(self, hidden_states)
        picked.append(out[2].unique().numel())
        return out

    monkeypatch.setattr(modeling_mixtral.MixtralTopKRouter, "forward", uniform)
    forced = measure_hf_step(cfg, 8, 2, setup, device="cpu", method="allocator")
    assert set(picked) == {cfg.experts_per_token}  # the routing really was forced: k experts in use, not E
    assert forced == seeded
    predicted = predict_step(cfg, 8, setup, impl="transformers", batch=2, mode="plain", device="cpu")
    assert predicted.at(2) == forced


def test_fp32_experts_on_meta_are_refused_in_one_line():
    with pytest.raises(AccountingError, match="meta kernel takes bf16 weights only") as err:
        measure_hf_step(tiny("mixtral"), 8, 1, TrainingSetup(precision="amp-bf16"), device="meta")
    assert "\n" not in str(err.value)


def test_what_is_not_transliterated_is_named(monkeypatch):
    """A type without a program (PhiMoE's ``PROGRAMS`` entry removed) is named in its one reason."""
    from lm_accounting.analytic.ops.transformers import PROGRAMS

    monkeypatch.delitem(PROGRAMS, "phimoe")
    phimoe = config_from_hf(
        {
            "model_type": "phimoe",
            "vocab_size": 96,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 64,
        }
    )
    reasons = unsupported(phimoe, TrainingSetup(), "transformers")
    assert any("phimoe is not transliterated" in r for r in reasons)
    assert unsupported(tiny("mixtral"), TrainingSetup(checkpoint="selective"), "transformers") == [
        "transformers has no selective activation checkpointing"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("step, layers, zero, precision", [(3, 6, 3, "bf16"), (4, 8, 2, "amp-bf16")], ids=str)
def test_fsdp2_over_a_sparse_step_of_three_or_more(step, layers, zero, precision):
    """Qwen3-MoE's ``decoder_sparse_step`` 3 and 4: the dense layers between sparse ones are runs whose ends meet
    unlike FSDP2 units, cut by the program (``tensors.split_runs``); rank 0 of ZeRO-2/3 over 4 ranks equals the
    fake-PG job (bf16 experts: grouped_mm's FakeTensor kernel)."""
    from lm_accounting.layout import ParallelLayout

    fields = {**MODELS["qwen3_moe"], "decoder_sparse_step": step, "num_hidden_layers": layers}
    cfg = config_from_hf({"model_type": "qwen3_moe", **SHAPE, **fields})
    setup, layout = TrainingSetup(precision=precision), ParallelLayout(dp=4, zero=zero)
    want = predict_step(cfg, 12, setup, impl="transformers", batch=2, layout=layout).at(2)
    assert measure_hf_step(cfg, 12, 2, setup, device="meta", layout=layout) == want
