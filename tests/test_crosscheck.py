"""Analytic == 2 × fvcore == FlopCounterMode, exactly, on the live model; parameters too."""

import pytest
import torch

from lm_accounting import ModelConfig, load_config, preset_names
from lm_accounting.analytic import flops as analytic_flops
from lm_accounting.measure.crosscheck import compare, crosscheck
from lm_accounting.measure.flops import count_flop_counter, count_fvcore, exact_einsum_macs, exact_matmul_macs

TINY = ModelConfig(
    vocab_size=97,
    context_length=32,
    num_layers=2,
    d_model=24,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    d_ff=40,
    qk_norm=True,
)


# 0.3-5.5 CPU-s each: a grid, sampled in the default run
@pytest.mark.grid
# a Gated DeltaNet hybrid has no live model: refused in one line (tests/test_arch_qwen3_next.py)
@pytest.mark.parametrize("name", [n for n in preset_names() if not load_config(n).hybrid])
def test_every_preset_on_meta_at_1024(name):
    cfg = load_config(name).with_context(1024)
    cc = crosscheck(cfg, seq=1024, batch=1)
    assert cc.mismatches() == []
    for counter in cc.counters:
        for item in cc.forward:
            assert counter.by_key[item.key] == item.total, (counter.counter, item.key)
        assert counter.total == cc.forward.total
    assert sum(cc.live_params.values()) == cc.params.total


@pytest.mark.slow
def test_gpt2_xl_at_16k_on_meta():
    cfg = load_config("gpt2-xl").with_context(16384)
    cc = crosscheck(cfg, seq=16384)
    assert cc.mismatches() == []
    assert cc.flop_counter.total == 149_522_795_724_800  # CS336 A1 transformer_accounting (e), published solutions
    fvcore = next(c for c in cc.counters if c.counter == "fvcore")
    assert fvcore.total == 149_522_795_724_800


@pytest.mark.slow
def test_backward_is_twice_forward_for_matmuls():
    cfg = load_config("gpt2-small").with_context(256)
    cc = crosscheck(cfg, seq=256, batch=2, backward=True)
    assert cc.mismatches() == []
    assert cc.backward.total - cc.flop_counter.total == 2 * cc.forward.total


def test_real_cpu_tensors_with_gqa_qknorm_batch():
    cc = crosscheck(TINY, seq=32, batch=3, device="cpu", backward=True)
    assert cc.mismatches() == []
    assert cc.live_params["layers.*.attn.q_norm"] == 2 * 8


def test_tied_model_counts_lm_head_flops_once_and_params_zero():
    cfg = load_config("qwen3-0.6b").with_context(128)
    cc = crosscheck(cfg, seq=128, counters=("flop_counter",))
    assert cc.mismatches() == []
    assert "lm_head" not in cc.live_params  # the shared weight is listed under token_embeddings
    assert cc.flop_counter.by_key["lm_head"] == 2 * 128 * 1024 * 151936


def test_mismatch_is_reported_by_component(monkeypatch):
    monkeypatch.setattr(
        analytic_flops, "lm_head_flops", lambda cfg, tokens: 2 * tokens * cfg.d_model * (cfg.vocab_size + 1)
    )
    cc = crosscheck(TINY, seq=16, counters=("flop_counter",))
    problems = cc.mismatches()
    assert problems and all("lm_head" in p for p in problems)


def test_compare_names_the_layer():
    from lm_accounting.analytic.params import parameter_breakdown

    bd = parameter_breakdown(TINY)
    counted = bd.totals()
    per_layer = {it.key: {i: it.per_layer for i in range(2)} for it in bd if it.per_layer is not None}
    assert compare(bd, counted, per_layer, 2, "parameters") == []
    per_layer["layers.*.ffn.w2"][1] += 1
    assert compare(bd, counted, per_layer, 2, "parameters") == [
        f"parameters: layers.1.ffn.w2: analytic {24 * 40:,} != counted {24 * 40 + 1:,}"
    ]


def test_exact_matmul_handle_broadcasts_either_operand():
    a, b = torch.randn(3, 1, 5, 7), torch.randn(4, 7, 2)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.matmul(x, b) + torch.matmul(b.transpose(-1, -2)[:1], x.transpose(-1, -2)).sum()

    counted = count_flop_counter(M(), a, [])
    fv = count_fvcore(M(), a, [])
    # written out: (3,1,5,7)@(4,7,2) has batch 3x4; (1,2,7)@(3,1,7,5) has batch 3x1 (fvcore's own
    # handle would count prod(first operand) x 5 and miss the factor 3)
    expected = 2 * (12 * 5 * 7 * 2) + 2 * (3 * 2 * 7 * 5)
    assert exact_matmul_macs([3, 1, 5, 7], [4, 7, 2]) == 12 * 5 * 7 * 2
    assert counted.total == fv.total == expected


@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),
        ("...id,...jd->...ij", [(2, 3, 5, 8), (2, 3, 7, 8)]),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 6)]),
        ("bi,oi->bo", [(6, 9), (4, 9)]),
    ],
)
def test_exact_einsum_handle_matches_flop_counter(equation, shapes):
    ops = [torch.randn(*s) for s in shapes]

    class E(torch.nn.Module):
        def forward(self, x):
            return torch.einsum(equation, x, *ops[1:])

    fcm = count_flop_counter(E(), ops[0], []).total
    fv = count_fvcore(E(), ops[0], [])
    assert fv.total == fcm == 2 * exact_einsum_macs(equation, [list(s) for s in shapes])
    assert isinstance(fv.total, int)


def test_einsum_handle_needs_no_memory_at_16k():
    # fvcore's default handle would allocate float64 arrays the size of these operands (~13 GB).
    macs = exact_einsum_macs("bhqd,bhkd->bhqk", [[1, 25, 16384, 64], [1, 25, 16384, 64]])
    assert macs == 25 * 16384 * 16384 * 64


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_crosscheck_small_preset():
    cfg = load_config("gpt2-small").with_context(512)
    cc = crosscheck(cfg, seq=512, batch=2, device="cuda", backward=True)
    assert cc.mismatches() == []


def test_run_that_cannot_fit_is_refused(run_cli, monkeypatch):
    from lm_accounting.measure import devices

    monkeypatch.setattr(devices, "available_bytes", lambda device: 10**9)  # pretend 1 GB is free
    r = run_cli("crosscheck", "gpt2-small", "--device", "cpu")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "needs" in r.err and "of the 1.000 GB" in r.err and "available" in r.err and "use meta" in r.err
    need = devices.counting_run_bytes(load_config("gpt2-small"), 1024, 1, backward=False)
    assert need > 4 * 190_460_160  # at least the fp32 weights


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_crosscheck_refused_without_gpu(run_cli):
    r = run_cli("crosscheck", "gpt2-small", "--device", "cuda")
    assert r.code == 2 and "no CUDA GPU" in r.err
