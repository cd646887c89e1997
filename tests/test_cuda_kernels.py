"""CUDA kernels' own scratch (``analytic.cuda_kernels``) against what an H200 measured (torch 2.11:
reports/cuda/kernels.csv, written by ``benchmarks/cuda_validation.py --only kernels``), and FSDP2's
launch metadata by hand.  No GPU needed: the measured table is committed."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lm_accounting.analytic.cuda_kernels import (
    chunk_cat_metadata,
    index_put_scratch,
    split_copy_metadata,
    sum_rows_scratch,
)

MEASURED = Path(__file__).resolve().parent.parent / "reports" / "cuda" / "kernels.csv"


def measured(kernel: str) -> list[tuple[int, int, int]]:
    with MEASURED.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["kernel"].startswith(kernel)]
    return [(int(r["rows"]), int(r["width"]), int(r["transient_bytes"])) for r in rows]


def test_sum_over_rows_equals_every_measured_point():
    """35 (rows, width) points from 512 to 262,144 rows: none below 1,024 rows (no global reduction),
    the 2·rows·width·4 staging while the grid has room, capped at the 132 SMs' target, and the halves of
    a 2³² byte input (32-bit indexing)."""
    points = measured("sum over rows")
    assert len(points) == 35
    assert [(r, w) for r, w, got in points if sum_rows_scratch(r, w) != got] == []


def test_sum_over_rows_by_hand():
    """16,384 rows of d_model 768 (gpt2-small's ln_final at B 2, S 8,192: the 50.4 MB the H200 showed
    above the prediction before this was modelled): 4 outputs per thread, blocks of 32 × 4 threads,
    a grid of 768 / 4 / 32 = 6 blocks; each thread's rows 16,384 / 4 = 4,096 ≥ 256, so a global
    reduction over max(min(⌈132·16 / 6⌉ = 352, ⌈4,096 / 16⌉ = 256), 16) = 256 blocks per output column:
    4 · 768 · 256 · 32 · 4 bytes of staging and 4 · 6 of semaphores."""
    assert sum_rows_scratch(16_384, 768) == 4 * 768 * 256 * 32 * 4 + 4 * 6 == 100_663_320
    assert sum_rows_scratch(512, 768) == 0  # 128 rows per thread: no global reduction


def test_index_backward_exact_up_to_one_tile_then_a_stated_lower_bound():
    """Up to 2,048 ids: four int64 copies and cub's one byte (exact: qwen3-30b-a3b at B 2, S 1,024 was
    65,537 B above the prediction before).  Beyond: the copies, cub's alternate buffers and 255 bytes
    of slack, low by cub's tile tables only: 5,376 B (2.7%) at 4,096 ids to 62,720 B (0.5%) at 262,144."""
    for tokens, _, got in measured("index backward"):
        want = index_put_scratch(tokens)
        if tokens <= 2048:
            assert want == got == 32 * tokens + 1
        else:
            assert want == 48 * tokens + 255 and 0 < got - want < got * 3 // 100, tokens


@pytest.mark.parametrize(
    "ranks, root, block",
    [(4, 33_632, 18_744), (8, 25_248, 9_528)],
)
def test_fsdp_copy_out_metadata_equals_the_zero3_job(ranks, root, block):
    """gpt2-small (V 50,257, d 768, d_ff 3,072), fp32, over 4 and 8 ranks: what the ZeRO-3 job on the H200
    held beyond the prediction before this was modelled (the root at the backward peak, a block at the
    checkpointed forward's).  By hand at 4 ranks, root: shards of 12,565 rows · 768 · 4 B (embedding and
    head) and 192 · 4 B (the norm) take 18,848 + 18,848 + 1 = 37,697 blocks of 2,048 B; 4 ranks of them
    over at most 2 · 132 · 2,048 / 128 = 4,224 blocks make 36 per thread, 4 ranks per block, 9 iterations:
    2,095 + 2,095 + 1 blocks, and 8 · (4·3 + 1 + 4,191) = 33,632 bytes."""

    def rows(n: int) -> int:
        return -(-n // ranks)

    d, dff, vocab = 768, 3072, 50_257
    root_shards = [rows(vocab) * d * 4, rows(d) * 4, rows(vocab) * d * 4]  # embedding, ln_final, head
    block_shards = [rows(d) * 4, *(rows(d) * d * 4 for _ in "qkvo"), rows(d) * 4]  # ln1, q, k, v, o, ln2
    block_shards += [rows(dff) * d * 4, rows(d) * dff * 4, rows(dff) * d * 4]  # w1, w2, w3
    assert split_copy_metadata(root_shards, ranks) == root
    assert split_copy_metadata(block_shards, ranks) == block


def test_chunk_cat_metadata_by_hand():
    """Two gradients' chunks of 4,096 and 100 bytes: 2 + 1 blocks of 2,048 B; 8 · (5·2 + 2 + 3)."""
    assert chunk_cat_metadata([4096, 100]) == 8 * (10 + 2 + 3) == 120
