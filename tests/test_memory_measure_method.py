"""``lm-account memory --measure-method tracker|allocator`` (issue 9): the allocator path measures the
plain run on CPU tensors with no dispatch mode (torch.profiler's allocation events) and is compared
with the plain prediction; the tracker measures the traced run and is compared with the traced one.
The measured figures come from the live model, the predicted ones from the analytic replay: they are
independent counts, equal byte for byte."""

from __future__ import annotations

import json

import pytest

from lm_accounting.phases import PHASES

TINY = (
    "vocab_size = 31\ncontext_length = 16\nnum_layers = 2\nd_model = 18\nnum_heads = 6\nnum_kv_heads = 2\n"
    "head_dim = 10\nd_ff = 22\n"
)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def memory_json(run_cli, tiny, *flags):
    r = run_cli("memory", tiny, "--context", "7", "--batch", "3", *flags, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def assert_measured_equals(measured, step):
    assert measured["baseline"] == step["baseline"]
    for name in PHASES:
        assert measured[name] == step[name], name


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup",
    [
        (),
        ("--attention", "sdpa", "--checkpoint", "full"),
        ("--attention", "sdpa", "--checkpoint", "selective", "--precision", "amp-bf16"),
    ],
    ids=["naive", "sdpa+full", "sdpa+selective+amp-bf16"],
)
def test_allocator_on_cpu_equals_the_plain_prediction(run_cli, tiny, setup):
    data = memory_json(run_cli, tiny, *setup, "--measure", "cpu", "--measure-method", "allocator")
    measured, exact = data["measured"], data["implementation_exact"]
    assert measured["device"] == "cpu" and measured["method"] == "allocator"
    assert measured["compared_with"] == "step" and exact["step"]["run"] == "plain" and exact["device"] == "cpu"
    assert_measured_equals(measured, exact["step"])
    # the traced prediction differs from this measurement, so comparing with the wrong one would fail
    assert any(measured[name] != exact["step_traced"][name] for name in PHASES)


def test_tracker_is_the_default_and_compares_with_the_traced_run(run_cli, tiny):
    data = memory_json(run_cli, tiny, "--attention", "sdpa", "--measure", "cpu")
    measured, exact = data["measured"], data["implementation_exact"]
    assert measured["method"] == "tracker" and measured["compared_with"] == "step_traced"
    assert_measured_equals(measured, exact["step_traced"])
    assert measured["backward"]["peak"] > exact["step"]["backward"]["peak"]


def test_table_labels_the_method(run_cli, tiny):
    r = run_cli("memory", tiny, "--context", "7", "--measure", "cpu", "--measure-method", "allocator")
    assert r.code == 0, r.err
    assert "measured on cpu (allocator)" in r.out and "the measurement against the plain run" in r.out
    assert r.err == ""  # no profiler chatter (measure.allocator.KINETO_QUIET)


@pytest.mark.parametrize(
    "flags",
    [
        ("--measure", "meta", "--measure-method", "allocator"),
        ("--measure", "cuda", "--measure-method", "allocator"),
        ("--measure-method", "allocator"),
        ("--measure-method", "tracker"),
        ("--measure", "cuda", "--measure-method", "tracker"),
        ("--measure", "cpu", "--measure-method", "heap"),
    ],
)
def test_other_combinations_are_one_line_exit_2(run_cli, tiny, flags):
    r = run_cli("memory", tiny, "--context", "7", *flags)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and r.out == ""


MHA = TINY.replace("num_kv_heads = 2\n", "").replace("d_model = 18", "d_model = 60")


def test_without_measure_the_prediction_is_for_a_cuda_gpu(run_cli, tmp_path):
    """fp32 sdpa on CUDA runs the memory-efficient kernel: its logsumexp rows are padded to 32 and its
    output is (B, S, h, d)-ordered, so merging the heads is a view (measured on an H100, torch 2.11).
    Hand count per layer at B = 3, S = 7, h = 6, d_head = 10 against the CPU kernel's run (--measure
    meta): + B·h·(32 − S)·4 = 1,800 bytes of logsumexp, − B·S·h·d_head·4 = 5,040 bytes of merged heads."""
    path = tmp_path / "mha.toml"
    path.write_text(MHA)
    cuda = memory_json(run_cli, path, "--attention", "sdpa")["implementation_exact"]
    meta = memory_json(run_cli, path, "--attention", "sdpa", "--measure", "meta")["implementation_exact"]
    assert cuda["device"] == "cuda" and meta["device"] == "meta"
    assert cuda["step"]["baseline"] == meta["step"]["baseline"]
    assert cuda["step"]["forward"]["end"] - meta["step"]["forward"]["end"] == 2 * (1_800 - 5_040)


def test_fp32_fused_attention_with_grouped_kv_is_refused_for_cuda(run_cli, tiny):
    r = run_cli("memory", tiny, "--context", "7", "--attention", "sdpa")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "no CUDA kernel" in r.err
    assert memory_json(run_cli, tiny, "--attention", "sdpa", "--precision", "bf16")["implementation_exact"]


def test_a_layout_is_refused_the_same_way_unless_measured_on_meta(run_cli, tiny):
    r = run_cli("memory", tiny, "--context", "8", "--attention", "sdpa", "--dp", "2", "--zero", "3")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "no CUDA kernel" in r.err
    flags = ("--context", "8", "--attention", "sdpa", "--dp", "2", "--zero", "3", "--measure", "meta")
    assert run_cli("memory", tiny, *flags).code == 0
