"""Mixture of experts and multi-head latent attention: hand counts, the balanced routing of the live
model, and exact cross-checks (fvcore and FlopCounterMode, forward and whole training steps)."""

import dataclasses

import pytest

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.hardware_flops import step_flops
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig, load_config
from lm_accounting.setup import TrainingSetup

TINY = dict(vocab_size=1000, context_length=64, d_model=64, num_heads=4, d_ff=96)
MOE = ModelConfig(
    **TINY, num_layers=4, num_kv_heads=2, num_experts=6, experts_per_token=2, expert_d_ff=32, shared_experts=2,
    dense_layers_first=1, name="tiny-moe",
)  # fmt: skip
DEEPSEEK = ModelConfig(
    **TINY, num_layers=3, num_experts=4, experts_per_token=3, expert_d_ff=16, shared_experts=1, dense_layers_first=1,
    kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, name="tiny-deepseek",
)  # fmt: skip
MLA_ONLY = ModelConfig(
    **TINY, num_layers=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, name="tiny-mla"
)


def test_deepseek_v3_parameters_by_hand():
    d, h, V, L = 7168, 128, 129280, 61
    attention = (
        d * 1536  # q_a_proj
        + 1536  # q_a_norm
        + 1536 * h * (128 + 64)  # q_b_proj
        + d * (512 + 64)  # kv_a_proj (latent + RoPE key)
        + 512  # kv_a_norm
        + 512 * h * (128 + 128)  # kv_b_proj
        + h * 128 * d  # output projection
    )
    dense_ffn = 3 * d * 18432
    moe = 256 * 3 * d * 2048 + 3 * d * 2048 + d * 256  # routed experts, 1 shared expert, router
    total = L * (attention + 2 * d) + 3 * dense_ffn + 58 * moe + d + 2 * V * d
    assert total == 671_026_404_352
    cfg = load_config("deepseek-v3")
    assert parameter_breakdown(cfg).total == total
    assert active_parameter_count(cfg) == total - 58 * (256 - 8) * 3 * d * 2048 == 37_552_282_624


def test_mixtral_forward_flops_by_hand():
    T, d, L, V, f = 1024, 4096, 32, 32000, 14336
    attention = 2 * T * d * (4096 + 1024 + 1024 + 4096) + 2 * 2 * 32 * T * T * 128  # projections + QKᵀ, AV
    router = 2 * T * d * 8
    experts = 3 * 2 * (T * 2) * d * f  # W1, W2, W3 on the T·k = 2T token rows
    total = L * (attention + router + experts) + 2 * T * d * V
    assert total == 26_658_862_006_272
    assert forward_flops(load_config("mixtral-8x7b").with_context(T), T).total == total


def test_latent_kv_cache_by_hand():
    cfg = load_config("deepseek-v3")
    assert kv_cache_bytes(cfg, 4096, 1, "bf16") == (512 + 64) * 61 * 4096 * 2  # latent + RoPE key per token, layer


@pytest.mark.parametrize("layers", range(1, 9))
@pytest.mark.parametrize("first", range(4))
@pytest.mark.parametrize("every", range(1, 4))
def test_moe_layer_count_is_the_layer_rule(layers, first, every):
    """``moe_layers`` (closed form) counts exactly the layers ``layer_moe`` (transformers' rule) picks."""
    picked = [i for i in range(layers) if i >= first and (i + 1) % every == 0]
    try:
        cfg = dataclasses.replace(MOE, num_layers=layers, dense_layers_first=first, moe_every=every)
    except ConfigError as err:
        assert not picked and "no layer is a mixture of experts" in str(err)
        return
    assert cfg.moe_layers == len(picked) and [i for i in range(layers) if cfg.layer_moe(i)] == picked


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(num_experts=None), "applies only to a mixture of experts"),
        (dict(experts_per_token=7), "experts_per_token=7 exceeds num_experts=6"),
        (dict(experts_per_token=None), "needs experts_per_token"),
        (dict(mlp="gelu"), "SwiGLU experts only"),
        (dict(dense_layers_first=4), "no layer is a mixture of experts"),
        (dict(shared_experts=-1), "shared_experts must be zero or positive"),
        (dict(kv_lora_rank=8), "latent attention (kv_lora_rank) needs qk_nope_head_dim"),
    ],
)
def test_impossible_moe_and_mla_options_are_one_line(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(MOE, **change)


def test_mla_refuses_a_head_dim_and_grouped_kv_heads():
    with pytest.raises(ConfigError, match="leave head_dim out"):
        dataclasses.replace(MLA_ONLY, head_dim=16)
    with pytest.raises(ConfigError, match="one key/value head per query head"):
        dataclasses.replace(MLA_ONLY, num_kv_heads=2)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("seq", [37, 48])  # T·k = 74 over 6 experts: 12 each and 2 more; 96: 16 each
def test_balanced_routing_sends_every_token_to_k_distinct_experts(seq):
    """On real CPU tensors: tag each token row with its index and read back, from the rows each expert's W1
    receives, which expert saw which token."""
    from lm_accounting.model import build_model
    from lm_accounting.model.moe import MixtureOfExperts

    model = build_model(MOE, "cpu")
    moe = next(m for m in model.modules() if isinstance(m, MixtureOfExperts))
    E, k, d = MOE.num_experts, MOE.experts_per_token, MOE.d_model
    seen: list[set[int]] = [set() for _ in range(seq)]
    per_expert = [0] * E

    def record(module, args):
        rows = args[0]  # (G, n, d): rows of experts 0..G-1
        for e in range(rows.shape[0]):
            for row in rows[e]:
                seen[int(row[0])].add(e)
                per_expert[e] += 1

    handle = moe.experts.w1.register_forward_pre_hook(record)
    x = torch.zeros(1, seq, d)
    x[0, :, 0] = torch.arange(seq, dtype=torch.float32)  # token t carries t in feature 0
    with torch.no_grad():
        moe(x)
    handle.remove()
    assert all(len(experts) == k for experts in seen)  # k distinct experts per token
    q, r = divmod(seq * k, E)
    assert per_expert == [q + 1] * r + [q] * (E - r)  # balanced: ⌈T·k/E⌉ or ⌊T·k/E⌋ each


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [MOE, DEEPSEEK, MLA_ONLY], ids=lambda c: c.name)
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_crosscheck_is_exact(cfg, device):
    from lm_accounting.measure.crosscheck import crosscheck

    cc = crosscheck(cfg, 37, 2, device=device, backward=True)
    assert cc.mismatches() == []
    assert cc.flop_counter.total == forward_flops(cfg.with_context(37), 37, 2).total


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(checkpoint="full"), TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")],
    ids=lambda s: s.label,
)
@pytest.mark.parametrize("shared", [0, 1])
def test_checkpointed_step_runs_the_predicted_hardware_flops(setup, shared):
    """Full checkpointing reruns every block but its last matmul: shared.w2 with shared experts; without them
    the routed experts' w2 is rerun (its output is saved by the router-weight multiply)."""
    from lm_accounting.measure.crosscheck import crosscheck

    base = DEEPSEEK if setup.attention == "naive" else MOE  # latent attention runs with naive attention only
    cfg = dataclasses.replace(base, shared_experts=shared)
    cc = crosscheck(cfg, 37, 2, device="meta", setup=setup, backward=True)
    assert cc.mismatches() == []
    fwd = forward_flops(cfg.with_context(37), 37, 2)
    blocks = sum(it.total for it in fwd if it.key.startswith("layers.*."))
    skipped = fwd["layers.*.ffn.w2"].total + (fwd["layers.*.moe.shared.w2"].total if shared else 0)
    assert step_flops(cfg.with_context(37), 37, 2, setup).recompute == blocks - skipped


def test_a_mixtral_config_json_gives_total_and_active_parameters(run_cli, tmp_path):
    import json

    from test_transformers_truth import CONFIGS

    path = tmp_path / "Mixtral-8x7B-v0.1" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS["mixtral-8x7b"][0]))
    r = run_cli(path, "--context", "1024")
    assert r.code == 0, r.err
    assert "parameters 46,702,792,704 (46.703 billion), 12,879,925,248 active per token" in r.out
    data = json.loads(run_cli(path, "--format", "json").out)
    assert (data["parameters"]["total"], data["parameters"]["active"]) == (46_702_792_704, 12_879_925_248)
    assert "router_aux_loss_coef" in data["config"]["ignored_fields"]
    # each component apart: the router, the routed experts (top-2 of 8: T·k rows) and no shared experts
    forward = json.loads(run_cli(path, "-S", "1024", "--format", "json").out)["forward_flops"]["components"]
    rows = {it["key"]: it["total"] for it in forward}
    assert rows["layers.*.moe.router"] == 32 * 2 * 1024 * 4096 * 8
    assert rows["layers.*.moe.experts.w1"] == 32 * 2 * (1024 * 2) * 4096 * 14336
    assert "layers.*.moe.shared.w1" not in rows


@pytest.mark.parametrize(
    "cfg",
    [MOE, DEEPSEEK, MLA_ONLY, dataclasses.replace(MOE, moe_every=2, dense_layers_first=0), load_config("openai-gpt2")],
    ids=lambda c: f"{c.name}-{c.moe_every}",
)
def test_parameter_tensors_are_the_live_models(cfg):
    """The AdamW step counters (one per tensor) and the for-loop temporaries read this list."""
    from lm_accounting.analytic.memory import parameter_tensor_count, parameter_tensor_sizes
    from lm_accounting.model import build_model

    live = [p.numel() for p in build_model(cfg, device="meta").parameters()]
    assert parameter_tensor_sizes(cfg) == live
    assert parameter_tensor_count(cfg) == len(live)


@pytest.mark.parametrize(("layers", "first", "every"), [(1000, 3, 1), (1001, 5, 3), (777, 0, 2), (300, 299, 1)])
def test_the_pair_scan_of_a_deep_model_sees_every_adjacent_pair(layers, first, every):
    from lm_accounting.analytic.memory import parameter_tensor_sizes, scan_layers

    cfg = dataclasses.replace(MOE, num_layers=layers, dense_layers_first=first, moe_every=every)

    def pairs(sizes):
        return {(a, b) for a, b in zip([0, *sizes], sizes, strict=False)}

    assert pairs(parameter_tensor_sizes(cfg, scan_layers(cfg))) == pairs(parameter_tensor_sizes(cfg))


def test_memory_of_a_mixture_of_experts_is_its_exact_model_states(run_cli):
    """Every expert's weights, gradients and AdamW moments: 4·N·4 bytes in fp32 (N = all 46.7B); the step
    is replayed (tests/test_moe_replay.py checks it against the tracker), the course convention is not
    shown, and what the replay does not model (latent attention) is refused, not guessed."""
    import json

    r = run_cli("memory", "mixtral-8x7b", "-S", "4096", "--optimizer", "fused", "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    exact = data["implementation_exact"]
    states = {it["key"]: it["total"] for it in exact["model_states"]["components"]}
    n = 46_702_792_704
    assert states == {"parameters": 4 * n, "gradients": 4 * n, "adamw.exp_avg": 4 * n, "adamw.exp_avg_sq": 4 * n}
    assert exact["adamw_step_temporaries"] == 0  # fused AdamW
    # fused: one 4-byte step counter per parameter tensor on the device: per layer ln1, q, k, v, o, ln2,
    # router, 3 stacked expert matrices (10); embedding, final norm, LM head (3)
    assert exact["adamw_step_counters"] == 4 * (32 * 10 + 3)
    assert exact["not_modelled"] == [] and exact["step"] is not None
    assert data["course_convention"] is None
    assert data["inference"]["kv_cache"] == 2 * 8 * 128 * 32 * 4096 * 4  # K and V, fp32
    refused = run_cli("memory", "deepseek-v3", "-S", "64", "--attention", "sdpa", "--measure", "meta")
    assert refused.code == 2 and "latent attention with attention=sdpa (the live model refuses it)" in refused.err


@pytest.mark.slow
def test_a_sweep_over_a_mixture_of_experts_fills_the_step_columns(tmp_path):
    from lm_accounting.sweep import sweep
    from lm_accounting.views.sweep import write_sweep

    result = sweep([load_config("mixtral-8x7b"), load_config("gpt2-small")], [256, 1024])
    rows = {(r["model"], r["context"]): r for r in result.rows}
    moe, dense = rows["mixtral-8x7b", 1024], rows["gpt2-small", 1024]
    assert moe["mem:parameters"] == 4 * 46_702_792_704 and moe["params"] == 46_702_792_704
    assert isinstance(moe["mem:peak"], int) and moe["mem:activations"] > 0 and moe["mem:max_context"] == 0
    assert moe["flops:total"] == 26_658_862_006_272
    assert isinstance(dense["mem:peak"], int) and dense["mem:max_context"] > 1024
    paths = write_sweep(result, tmp_path / "out", 80 * 10**9, "80 GB", plots=True)
    assert any(p.name == "memory_vs_context_mixtral-8x7b.png" for p in paths)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["crosscheck", "deepseek-v3", "-S", "64", "--attention", "sdpa"],
            "latent attention runs with attention=naive",
        ),
        (
            ["crosscheck", "mixtral-8x7b", "--set", "num_experts=100000000000", "-S", "8"],
            "a stacked expert matrix (experts·d_model·expert_d_ff",
        ),
        (
            ["crosscheck", "deepseek-v3", "--set", "kv_lora_rank=1000000000000000", "-S", "8"],
            "the KV up-projection",
        ),
        (
            ["infer", "deepseek-v3", "--prompt", "16", "--generate", "4", "--tp", "3"],
            "does not divide the 128 attention",
        ),
    ],
)
def test_impossible_live_runs_of_moe_and_mla_are_one_line(run_cli, args, message):
    r = run_cli(*args)
    assert r.code == 2 and message in r.err and r.err.count("\n") == 1


def test_a_mixed_model_has_no_single_per_layer_total_and_the_csv_has_active_parameters(run_cli):
    import csv
    import io

    table = run_cli("deepseek-v3", "-S", "1024").out
    total = next(line for line in table.splitlines() if line.startswith("total"))
    assert " - " in total  # 3 dense + 58 MoE blocks: no block has the sum of both
    assert "dense d_ff 18,432 in first 3 layers" in table and "256 experts × d_e 2,048, top-8" in table
    rows = list(csv.DictReader(io.StringIO(run_cli("deepseek-v3", "--format", "csv").out)))
    totals = {r["key"]: int(r["total"]) for r in rows if r["section"] == "parameter_totals"}
    assert totals == {"total": 671_026_404_352, "active": 37_552_282_624}
