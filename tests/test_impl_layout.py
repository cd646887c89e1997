"""``memory --impl transformers`` under an FSDP2 data-parallel layout: rank 0's step as the op library replays
it (``ops.predict_step(..., layout=...)``), labelled as the traced run on meta/CPU kernels (CUDA under a layout
is not ported), equal to the fake-PG job over transformers' own model (``--measure meta``); every layout the op
library refuses is one line and exit 2."""

import importlib
import json
import types

import pytest
from test_impl_cli import LLAMA_MINI, one_line_exit_2

from lm_accounting.commands import memory
from lm_accounting.config import AccountingError, load_config
from lm_accounting.layout import ParallelLayout

GEMMA2_MINI = {
    "model_type": "gemma2",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "sliding_window": 10,
}
# LLAMA_MINI by hand: a layer is q 64·64 + k 32·64 + v 32·64 + o 64·64 + gate, up 96·64 + down 64·96 + two norms
# 64 = 30,848 elements; the root is the embedding 128·64, the final norm 64 and the LM head 128·64 = 16,448
N = 16_448 + 2 * 30_848  # 78,144 elements
S, B = 32, 2
LABEL = "rank 0's step as the storage tracker sees it on meta (CPU kernel facts); CUDA under a layout not modelled"


def write(tmp_path, name, fields):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(fields))
    return path


@pytest.fixture
def llama_json(tmp_path):
    return write(tmp_path, "llama-mini", LLAMA_MINI)


def layout_json(run_cli, path, *args):
    r = run_cli("memory", path, "--impl", "transformers", "-S", S, "-B", B, *args, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_rank_zero_of_world_four_by_hand(run_cli, llama_json):
    """fp32, world 4: rank 0 starts with its quarter of every parameter and AdamW's two moments (12 bytes an
    element), the token ids and labels (2·B·S int64) and the rotary inv_freq buffers (2 · head_dim/2 fp32);
    backward ends with its gradient shards added; the step ends where it began.  ZeRO-2 keeps every unit
    unsharded after forward: its forward ends 4·N bytes above ZeRO-3's."""
    z3 = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "3")
    z2 = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "2")
    baseline = 12 * N // 4 + 2 * B * S * 8 + 2 * (16 // 2) * 4
    assert baseline == 235_520
    for data in (z3, z2):
        assert data["implementation"]["name"] == "transformers"
        assert data["implementation"]["model_class"] == "LlamaForCausalLM"
        step = data["step_traced"]
        assert step["baseline"] == baseline and step["optimizer_step"]["end"] == baseline
        assert step["backward"]["end"] == baseline + 4 * N // 4
        assert data["step"] is None and data["peak"] is None  # the plain CUDA run is not modelled here
        assert set(data["per_gpu"].values()) == {None}  # our model's sharding rules are not claimed for theirs
    assert z2["step_traced"]["forward"]["end"] - z3["step_traced"]["forward"]["end"] == 4 * N


def test_the_table_labels_the_figure_as_traced_never_cuda(run_cli, llama_json):
    r = run_cli("memory", llama_json, "--impl", "transformers", "-S", S, "--dp", "4", "--zero", "3")
    assert r.code == 0, r.err
    assert LABEL in r.out and "LlamaForCausalLM" in r.out
    assert "exact for cuda" not in r.out and "exact prediction" not in r.out


@pytest.mark.slow
def test_measure_meta_equals_the_fake_pg_job(run_cli, llama_json):
    """The fake-PG job over transformers' own decoder layers (FakeTensors) measures what was predicted."""
    for device in ("meta", "cpu"):  # FakeTensors, or real CPU tensors: the same bytes as the meta replay
        data = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "3", "--measure", device)
        assert data["measured"]["step"] == data["step_traced"]
    text = run_cli(
        "memory", llama_json, "--impl", "transformers", "-S", S, "--dp", "4", "--zero", "2", "--measure", "meta"
    )
    assert text.code == 0 and "equal, phase by phase" in text.out and "DIFFERS" not in text.out


def test_ddp_of_transformers_model_by_hand(run_cli, llama_json):
    """``--dp 4 --zero 0``: DDP as the HF Trainer wraps the model.  Every rank holds every parameter, AdamW's two
    moments and the reducer's bucket buffers, a copy of every gradient (16 bytes an element), the token ids and
    labels and the rotary buffers; backward ends with the whole gradients added.  The collectives are the bucket
    all-reduces: 4·N = 312,576 bytes, one bucket (under the 1 MiB first cap).  The text names DDP.  Without
    checkpointing the HF Trainer turns ``find_unused_parameters`` on (the default here): the reducer's two int32
    maps, one slot per parameter tensor (21: 9 per layer, the embedding, the final norm and the head), add 2·4·21
    bytes, and the 84-byte map is all-reduced after the buckets."""
    off = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "0", "--no-find-unused-parameters")
    baseline = 16 * N + 2 * B * S * 8 + 2 * (16 // 2) * 4
    step = off["step_traced"]
    assert step["baseline"] == baseline == 1_251_392 and step["optimizer_step"]["end"] == baseline
    assert step["backward"]["end"] == baseline + 4 * N
    assert [(c["kind"], c["count"], c["payload_bytes"]) for c in off["collectives"]] == [("all_reduce", 1, 4 * N)]
    on = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "0")
    assert on["step_traced"]["baseline"] == baseline + 2 * 4 * 21 and on["step_traced"]["backward"]["end"] == (
        baseline + 4 * N + 2 * 4 * 21
    )
    assert [(c["kind"], c["count"], c["payload_bytes"]) for c in on["collectives"]] == [
        ("all_reduce", 1, 4 * N),
        ("all_reduce", 1, 4 * 21),
    ]
    full = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "0", "--checkpoint", "full")
    assert full["step_traced"]["baseline"] == baseline  # the Trainer's default under checkpointing: off
    r = run_cli("memory", llama_json, "--impl", "transformers", "-S", S, "--dp", "4", "--zero", "0")
    assert r.code == 0 and "DistributedDataParallel" in r.out and "tests/test_ops_ddp.py" in r.out, r.err


def test_zero1_of_transformers_model_by_hand(run_cli, llama_json):
    """``--dp 4 --zero 1``: ZeroRedundancyOptimizer gives whole tensors, largest first, to the least-loaded rank
    (the lowest on a tie): the two 8,192-element embedding and head to ranks 0 and 1, two of the six 6,144-element
    MLP matrices each to ranks 2 and 3, one each to ranks 0 and 1 (14,336 each), the four 4,096s to 2, 3, 0, 1, the
    four 2,048s to 2, 3, 0, 1: rank 0 owns 20,480 elements (the five 64-element norms go to ranks 2 and 3).  Its
    baseline is DDP's with AdamW's moments of those only; after the step every one of the 21 tensors is broadcast
    from its owner (4·N bytes)."""
    data = layout_json(run_cli, llama_json, "--dp", "4", "--zero", "1", "--no-find-unused-parameters")
    baseline = 8 * N + 8 * 20_480 + 2 * B * S * 8 + 2 * (16 // 2) * 4
    assert data["step_traced"]["baseline"] == baseline == 790_080
    broadcasts = [(c["count"], c["payload_bytes"]) for c in data["collectives"] if c["kind"] == "broadcast"]
    assert broadcasts == [(2 * 9 + 3, 4 * N)]


@pytest.mark.slow
def test_ddp_measure_meta_equals_the_fake_pg_job(run_cli, llama_json):
    """FakeTensors with find_unused_parameters off (or under checkpointing, the Trainer's off); on (the Trainer's
    default without checkpointing) on real CPU tensors, and refused on meta in one line."""
    for precision, zero in (("bf16", "0"), ("amp-bf16", "0"), ("amp-bf16", "1")):
        args = ["--dp", "2", "--zero", zero, "--measure", "meta", "--precision", precision]
        data = layout_json(run_cli, llama_json, *args, "--no-find-unused-parameters")
        assert data["measured"]["step"] == data["step_traced"], (precision, zero)
    data = layout_json(run_cli, llama_json, "--dp", "2", "--zero", "0", "--measure", "meta", "--checkpoint", "full")
    assert data["measured"]["step"] == data["step_traced"]
    for zero in ("0", "1"):
        data = layout_json(run_cli, llama_json, "--dp", "2", "--zero", zero, "--measure", "cpu")
        assert data["measured"]["step"] == data["step_traced"], zero


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dp", "2", "--zero", "0", "--measure", "meta"], "FakeTensors do not have"),
        (["--dp", "2", "--zero", "1", "--find-unused-parameters", "--measure", "meta", "--checkpoint", "full"],
         "FakeTensors do not have"),
        (["--dp", "2", "--zero", "3", "--find-unused-parameters"], "DDP's option"),
        (["--no-find-unused-parameters"], "DDP's option"),
    ],
    ids=["default-meta", "on-meta", "fsdp2", "one-gpu"],
)  # fmt: skip
def test_find_unused_parameters_refusals(run_cli, llama_json, args, message):
    r = run_cli("memory", llama_json, "--impl", "transformers", "-S", S, *args)
    one_line_exit_2(r, message)


def test_llama_3_8b_at_8k_over_64_ranks_is_the_fake_pg_figure(run_cli):
    """The issue's case: Llama-3-8B, 8,192 tokens, FSDP2 ZeRO-3 over 64 ranks, amp-bf16, sdpa, transformers'
    layers.  The figures are the fake-PG job's (``measure_hf_step(..., layout=ParallelLayout(dp=64, zero=3))`` on
    meta, run once by hand, ~7 CPU-s): forward 67,471,844,624 and backward 69,573,125,384 bytes."""
    args = ["llama-3-8b", "--impl", "transformers", "--context", "8192", "--dp", "64", "--zero", "3"]
    r = run_cli("memory", *args, "--precision", "amp-bf16", "--attention", "sdpa", "--format", "csv")
    assert r.code == 0, r.err
    assert "peak (traced on meta),forward,67471844624" in r.out
    assert "peak (traced on meta),backward,69573125384" in r.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "2", "--sp"], "no sequence parallel"),
        (["--tp", "2", "--optimizer", "fused"], "foreach AdamW only"),
        (["--dp", "4", "--zero", "1", "--pp", "2"], "data parallel only"),
        (["--dp", "4", "--zero", "0", "--tp", "2"], "tensor parallel is run alone"),
        (["--dp", "4", "--zero", "3", "--rank", "1"], "predicts rank 0 (the worst) only"),
        (["--dp", "4", "--zero", "3", "--measure", "cuda"], "traced and measured on meta or cpu"),
        (["--dp", "4", "--zero", "3", "--measure", "cpu", "--measure-method", "allocator"], "storage tracker"),
    ],
)
def test_a_layout_the_op_library_refuses_is_one_line(run_cli, llama_json, args, message):
    one_line_exit_2(run_cli("memory", llama_json, "--impl", "transformers", "-S", S, *args), message)


def test_transformers_tp_prints_the_replay_beside_the_fake_pg_job(run_cli, llama_json):
    """``--tp 2 --measure meta``: transformers' own TP plan, the replay equal to the job, phase by phase; its
    collectives by hand (T = B·S = 64 tokens, d 64, vocab 128, 2 layers, fp32): forward, the embedding's and two
    per layer all-reduced (5 × T·d·4 bytes) and the logits all-gathered (T·V·4); backward, the head's and five
    per layer input gradients all-reduced (11 × T·d·4)."""
    data = layout_json(run_cli, llama_json, "--tp", "2", "--measure", "meta")
    assert data["measured"]["step"] == data["step_traced"]
    td = B * S * 64 * 4
    got = {(c["kind"], c["phase"]): (c["count"], c["payload_bytes"]) for c in data["collectives"]}
    assert got == {
        ("all_reduce", "forward"): (5, 5 * td),
        ("all_gather", "forward"): (1, B * S * 128 * 4),
        ("all_reduce", "backward"): (11, 11 * td),
    }
    r = run_cli("memory", llama_json, "--impl", "transformers", "-S", S, "--tp", "2", "--measure", "meta")
    assert r.code == 0 and "equal, phase by phase" in r.out and "tests/test_ops_tp.py" in r.out, r.err
    fsdp = layout_json(run_cli, llama_json, "--tp", "2", "--dp", "2", "--zero", "3", "--measure", "meta")
    assert fsdp["measured"]["step"] == fsdp["step_traced"]


def test_moe_and_the_bf16_policy_are_predicted(run_cli, tmp_path):
    moe = ["qwen3-30b-a3b", "--impl", "transformers", "-S", 64, "--dp", "4", "--zero", "3"]
    r = run_cli("memory", *moe)  # transformers' grouped_mm experts: predicted under FSDP2
    assert r.code == 0 and "Qwen3MoeForCausalLM" in r.out, r.err
    one_line_exit_2(run_cli("memory", *moe, "--measure", "meta"), "meta kernel takes bf16 weights only")
    gemma = write(tmp_path, "gemma2-mini", GEMMA2_MINI)
    args = ["--impl", "transformers", "-S", S, "--dp", "4", "--zero", "3", "--precision", "amp-bf16"]
    # FSDP2's bf16 policy over Gemma 2 at ZeRO-3: replayed (each layer's inputs cast outside the checkpoint)
    assert run_cli("memory", gemma, *args).code == 0
    assert run_cli("memory", gemma, *args[:-2]).code == 0  # fp32: replayed


def test_the_request_refuses_a_rank_before_anything_runs(llama_json):
    cfg = load_config(llama_json)
    with pytest.raises(AccountingError, match="rank 0"):
        memory.Request(cfg, S, layout=ParallelLayout(dp=4, zero=3), rank=2, impl="transformers")


# -- sweep --measure-memory: transformers' rows are measured (finding F8), every mismatch reported ------------


def sweep_json(run_cli, tmp_path, *args, code=0):
    out = tmp_path / "sweep"
    r = run_cli("sweep", *args, "--measure-memory", "meta", "--out", out)
    assert r.code == code, r.err
    return json.loads((out / "sweep.json").read_text())


@pytest.mark.slow
def test_sweep_measures_transformers_rows_on_meta(run_cli, llama_json, tmp_path):
    """Each point of a config.json (--impl transformers) is measured on transformers' own model: its traced
    peak equals the op library's, and nothing is reported as a mismatch."""
    data = sweep_json(run_cli, tmp_path, llama_json, "--contexts", "16,32")
    rows = data["rows"]
    assert [r["impl"] for r in rows] == ["transformers", "transformers"]
    for row in rows:
        assert row["measured:peak"] is not None and row["measured:device"] == "meta"
        assert row["measured:peak"] == row["mem:peak_traced"]
    assert data["mismatches"] == []


@pytest.mark.slow
def test_a_measured_peak_that_differs_is_a_mismatch(run_cli, llama_json, tmp_path, monkeypatch):
    """A measurement one byte above the prediction is listed (and the sweep exits 1), not silently tabulated."""
    sweep_module = importlib.import_module("lm_accounting.sweep")  # the package exports a function named sweep

    real = sweep_module.measure_point

    def one_byte_more(*args):
        return types.SimpleNamespace(peak=real(*args).peak + 1)

    monkeypatch.setattr(sweep_module, "measure_point", one_byte_more)
    data = sweep_json(run_cli, tmp_path, llama_json, "--contexts", "16,32", code=1)  # exit 1: a mismatch
    assert len(data["mismatches"]) == 2 and all("measured peak" in m for m in data["mismatches"])
